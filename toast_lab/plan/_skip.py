"""Skipping one member of a JSON object without parsing its value.

A plan file's "view" section is for the JupyterLab extension; loading a plan never needs it.
`json.loads` recurses once per nesting level, so a view nested a few thousand levels deep (a
corrupted or hostile file) would raise RecursionError and lose the decisions beside it. This
scan finds the member's text by counting brackets outside strings — a loop with an integer
depth, linear in the text, with no recursion — and replaces the value by `null` before the
text is parsed.
"""

from __future__ import annotations

import json
import re

# A JSON string (escapes included), or one structural character. Numbers, literals and
# whitespace between them are skipped over by finditer.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\],:]', re.S)


def without_member(text: str, key: str) -> str:
    """`text` with the value of the top-level member `key` replaced by null (every occurrence
    of the key). Text that does not scan as one balanced JSON object comes back unchanged, so
    json.loads reports its error at the true line and column."""
    spans: list[tuple[int, int]] = []
    depth, expect_key, name, start = 0, False, None, None
    for m in _TOKEN.finditer(text):
        t = m.group()
        if t == "{" or t == "[":
            if depth == 0 and (t == "[" or text[:m.start()].strip()):
                return text  # not an object at the start of the text
            depth += 1
            expect_key = depth == 1
        elif t == "}" or t == "]":
            if depth == 1 and start is not None:
                spans.append((start, m.start()))
                start = None
            depth -= 1
            if depth < 0:
                return text
            if depth == 0:
                return _splice(text, spans) if text[m.end():].strip() == "" else text
        elif depth == 1:
            if t == ",":
                if start is not None:
                    spans.append((start, m.start()))
                    start = None
                expect_key = True
            elif t == ":":
                if name == key:
                    start = m.end()
                name = None
            elif expect_key:  # a key: a short string, decoded as JSON (nothing executes)
                try:
                    name = json.loads(t)
                except ValueError:
                    return text
                expect_key = False
    return text  # unbalanced: let json.loads say where


def _splice(text: str, spans: list[tuple[int, int]]) -> str:
    """Each span's text replaced by null, keeping its line breaks (errors elsewhere in the file
    keep their line numbers)."""
    for a, b in reversed(spans):
        text = f"{text[:a]} null{chr(10) * text.count(chr(10), a, b)}{text[b:]}"
    return text


__all__ = ["without_member"]
