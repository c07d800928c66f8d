"""Whether a piece of an engine's OpenAI event stream carries generated text: what a streaming client
waits for first (its first token, as clients and benchmarks time it). An engine's first events may carry
none: a chat stream's role event, and tokens that decode to no text yet (part of a character)."""

from __future__ import annotations

import re

# a non-empty string under a key that holds generated text: chat's content, reasoning and tool calls'
# names and arguments, completions' text (the engine's JSON, with or without spaces)
_TEXT = re.compile(rb'"(?:content|reasoning_content|reasoning|name|arguments|text)"\s*:\s*"(?!")')


def carries_text(piece: bytes) -> bool:
    return _TEXT.search(piece) is not None
