"""MkDocs hook: fills the configuration reference into docs/configuration.md from the schema at build
time (``fairgate.gateway.config_reference``), so the page cannot drift from what the gateway accepts."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- configuration reference: generated -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from fairgate.gateway.config_reference import reference_markdown

    return markdown.replace(MARKER, reference_markdown())
