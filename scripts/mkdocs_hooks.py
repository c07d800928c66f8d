"""MkDocs hook: fills generated parts into the docs at build time, so that no page can drift from the
code: the configuration reference into docs/configuration.md (``fairgate.gateway.config_reference``)
and the table of every registered plug-in into docs/layout.md (``fairgate.cli.plugins``)."""

from __future__ import annotations

from typing import Any

CONFIGURATION = "<!-- configuration reference: generated -->"
PLUGINS = "<!-- plug-ins: generated -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CONFIGURATION in markdown:
        from fairgate.gateway.config_reference import reference_markdown

        markdown = markdown.replace(CONFIGURATION, reference_markdown())
    if PLUGINS in markdown:
        from fairgate.cli.plugins import layout_markdown

        markdown = markdown.replace(PLUGINS, layout_markdown())
    return markdown
