"""The ``fairgate`` command: one module per command (``simulate``, ``serve``, ``loadgen``, ``profile``,
``bench``), each adding its own arguments and running itself. Bad input ends with one line naming the
problem and exit status 2."""

from __future__ import annotations

import argparse
import sys

from fairgate.cli import bench, loadgen, profile, serve, simulate
from fairgate.cli.parsing import Parser, UsageError

COMMANDS = (simulate, serve, loadgen, profile, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fairgate", description="A fair, multi-tenant gateway for LLM serving (VTC).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub).set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except UsageError as exc:
        print(f"fairgate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fairgate: interrupted", file=sys.stderr)
        return 130
