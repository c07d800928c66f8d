"""``fairgate bench NAME``: one of the benchmarks registered in ``fairgate.loadgen.benches``, its options
as flags (from its parameters), its report printed and, with ``--json``, its figures written."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from fairgate.cli.parsing import Parser, UsageError
from fairgate.core.registry import Param

if TYPE_CHECKING:
    from fairgate.loadgen.benches import Bench


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Only ``bench`` and the bench's name: its own options are parsed once it is known, so that every
    other command starts without importing every benchmark (and what they import: plots, servers)."""
    bench = sub.add_parser("bench", help="benchmarks", description="fairgate bench NAME [options]; NAME --help")
    bench.add_argument("target", metavar="NAME", help="the benchmark (an unknown name lists them)")
    bench.add_argument("options", nargs=argparse.REMAINDER, help="its options")
    return bench


def bench_parser(name: str, plugin: Bench) -> argparse.ArgumentParser:
    """The options of one bench, as flags from its parameters."""
    parser = Parser(prog=f"fairgate bench {name}", description=plugin.help)
    for param in plugin.params:
        add_option(parser, param)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    return parser


def add_option(parser: argparse.ArgumentParser, param: Param) -> None:
    """A bench's parameter as a flag: ``--kv-tokens`` for ``kv_tokens``; a true-or-false one is a switch."""
    flag = "--" + param.name.replace("_", "-")
    if param.kind is bool:
        parser.add_argument(flag, dest=param.name, action="store_true", help=param.doc)
    else:
        parser.add_argument(flag, dest=param.name, type=param.kind, default=param.default, help=param.doc)


def run(args: argparse.Namespace) -> int:
    from fairgate.loadgen.benches import bench_for

    try:
        plugin = bench_for(args.target)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    parsed = bench_parser(args.target, plugin).parse_args(args.options)
    options = {p.name: getattr(parsed, p.name) for p in plugin.params}
    try:
        plugin.check(options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    figures = plugin.run(options)
    print(plugin.report(figures))
    if parsed.json:
        Path(parsed.json).write_text(json.dumps(figures, indent=2))
    return 0
