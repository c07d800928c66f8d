"""Every registered plug-in, from the registries themselves: the table ``docs/layout.md`` shows (filled
in when the docs are built, so it cannot drift from what is registered)."""

from __future__ import annotations

from typing import Any

from fairgate.core.placement.base import PLACEMENTS
from fairgate.core.policies.base import POLICIES
from fairgate.loadgen.benches.base import BENCHES
from fairgate.workers.engines import engines_described


def plugin_rows() -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, where its modules live, a plug-in as ``Registry.describe`` gives it), every kind."""
    return (
        [("policy", "fairgate/core/policies/", row) for row in POLICIES.describe()]
        + [("placement", "fairgate/core/placement/", row) for row in PLACEMENTS.describe()]
        + [("engine", "workers/engines/", row) for row in engines_described()]
        + [("bench", "loadgen/benches/", row) for row in BENCHES.describe()]
    )


def layout_markdown() -> str:
    """One row per plug-in: its kind, module, how it is chosen, what it is."""
    out = ["| kind | name | module | chosen by | what it is |", "|---|---|---|---|---|"]
    for kind, folder, row in plugin_rows():
        parts = row["module"].split(".")  # an engine is a sub-package (its plug-in: one module of it)
        module = folder + (f"{parts[-2]}/" if kind == "engine" else f"{parts[-1]}.py")
        chosen = f"`fairgate bench {row['name']}`" if kind == "bench" else f"`{row['usage']}`"
        summary = row["summary"]
        out.append(f"| {kind} | `{row['name']}` | `{module}` | {chosen} | {summary} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(layout_markdown(), end="")
