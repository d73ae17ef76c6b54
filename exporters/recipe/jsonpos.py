"""Parse JSON while remembering where each value starts, so errors can name the line.

The standard library parses JSON but forgets positions; this walker reuses `json`'s own scanner for every
scalar and string, and only tracks where objects and arrays (and their members) begin.
"""

from __future__ import annotations

import json
from typing import Any

from exporters.errors import JsonPositionError

JsonPath = tuple[str | int, ...]

_WHITESPACE = " \t\n\r"
_decoder = json.JSONDecoder()


class _ConstantError(ValueError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(name)


def _reject_constant(name: str):
    raise _ConstantError(name)


def parse_with_positions(text: str) -> tuple[Any, dict[JsonPath, int]]:
    """Parse `text` and return `(value, lines)`, `lines` mapping each JSON path to the 1-based line where its value
    starts (for an object member, the line of its key).

    Example:
        >>> value, lines = parse_with_positions('{\\n  "a": [1,\\n 2]\\n}')
        >>> lines[("a", 1)]
        3
    """
    try:
        # The standard parser's message is the one users know; positions come after. NaN and Infinity are not JSON.
        json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        raise JsonPositionError(err.msg, err.lineno, err.colno) from None
    except _ConstantError as err:
        offset = max(text.find(err.name), 0)
        line = text.count("\n", 0, offset) + 1
        raise JsonPositionError(f"{err.name} is not valid JSON (use a finite number)", line,
                                offset - text.rfind("\n", 0, offset)) from None
    except RecursionError:
        raise JsonPositionError("nested too deeply", 1, 1) from None
    lines: dict[JsonPath, int] = {}
    line_starts = [0]
    for index, char in enumerate(text):
        if char == "\n":
            line_starts.append(index + 1)

    def line_of(offset: int) -> int:
        low, high = 0, len(line_starts) - 1
        while low < high:
            mid = (low + high + 1) // 2
            if line_starts[mid] <= offset:
                low = mid
            else:
                high = mid - 1
        return low + 1

    def skip(index: int) -> int:
        while index < len(text) and text[index] in _WHITESPACE:
            index += 1
        return index

    def walk(index: int, path: JsonPath, key_line: int | None) -> tuple[Any, int]:
        index = skip(index)
        lines[path] = key_line if key_line is not None else line_of(index)
        char = text[index]
        if char == "{":
            result: dict[str, Any] = {}
            index = skip(index + 1)
            if text[index] == "}":
                return result, index + 1
            while True:
                index = skip(index)
                member_line = line_of(index)
                key, index = _decoder.raw_decode(text, index)
                index = skip(index)
                assert text[index] == ":"
                result[key], index = walk(index + 1, (*path, key), member_line)
                index = skip(index)
                if text[index] == ",":
                    index += 1
                    continue
                return result, index + 1
        if char == "[":
            items: list[Any] = []
            index = skip(index + 1)
            if text[index] == "]":
                return items, index + 1
            while True:
                item, index = walk(index, (*path, len(items)), None)
                items.append(item)
                index = skip(index)
                if text[index] == ",":
                    index += 1
                    continue
                return items, index + 1
        return _decoder.raw_decode(text, index)

    try:
        value, _ = walk(0, (), None)
    except RecursionError:
        raise JsonPositionError("nested too deeply", 1, 1) from None
    return value, lines


def format_path(path: JsonPath) -> str:
    """`("exports", 0, "name")` as `$.exports[0].name`."""
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def nearest_line(lines: dict[JsonPath, int], path: JsonPath) -> int | None:
    """The line of `path`, or of its closest ancestor present in the text (a missing key points at its object)."""
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None
