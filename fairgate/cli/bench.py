"""``fairgate bench NAME``: one of the benchmarks registered in ``fairgate.loadgen.benches``, its options
as flags (from its parameters), its report printed and, with ``--json``, its figures written."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fairgate.cli.parsing import UsageError
from fairgate.core.registry import Param
from fairgate.loadgen.benches import bench_for, bench_names


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from fairgate.cli.parsing import Parser

    bench = sub.add_parser("bench", help="benchmarks")
    targets = bench.add_subparsers(dest="target", required=True, parser_class=Parser)
    for name in bench_names():
        plugin = bench_for(name)
        parser = targets.add_parser(name, help=plugin.help)
        for param in plugin.params:
            add_option(parser, param)
        parser.add_argument("--json", default=None, help="also write the figures to this file")
    return bench


def add_option(parser: argparse.ArgumentParser, param: Param) -> None:
    """A bench's parameter as a flag: ``--kv-tokens`` for ``kv_tokens``; a true-or-false one is a switch."""
    flag = "--" + param.name.replace("_", "-")
    if param.kind is bool:
        parser.add_argument(flag, dest=param.name, action="store_true", help=param.doc)
    else:
        parser.add_argument(flag, dest=param.name, type=param.kind, default=param.default, help=param.doc)


def run(args: argparse.Namespace) -> int:
    plugin = bench_for(args.target)
    options = {p.name: getattr(args, p.name) for p in plugin.params}
    try:
        plugin.check(options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    figures = plugin.run(options)
    print(plugin.report(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0
