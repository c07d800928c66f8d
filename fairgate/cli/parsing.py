"""What every command shares: one-line usage errors, and checks of values several commands take."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, NoReturn

from fairgate.core import make_policy


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def check_policies(specs: list[str]) -> list[str]:
    """The policies as given, each checked (an unknown or malformed one is a usage error)."""
    for spec in specs:
        try:
            make_policy(spec)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return specs


def read_profile(path: Path) -> dict[str, Any]:
    """A cost profile ``{input: {output: [batch, prefill_s, decode_s]}}`` from a JSON file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read profile {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"profile {path}: expected an object {{input: {{output: [batch, prefill_s, decode_s]}}}}")
    return data


def positive_ints(text: str, flag: str) -> list[int]:
    """Comma-separated whole numbers, at least one, all positive."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} needs positive whole numbers, got {text!r}")
    return values
