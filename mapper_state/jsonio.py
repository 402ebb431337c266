"""JSON in and out for state values, exact for integers of any size.

orjson is fast, but it reads an integer beyond 64 bits as a float and refuses to write
one: a bookmark of ``18446744073709551616`` would be stored as ``1.8446744073709552e+19``.
Both directions fall back to the standard library for such documents (only those: a
cheap scan for 19 digits in a row decides), so a state is stored as the tap wrote it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# What a parse failure raises, whichever parser ran: both parsers' errors are ValueErrors.
DecodeError = ValueError

# An integer of 19 digits or more may be outside the 64-bit range orjson keeps exact.
_LONG_DIGITS = re.compile(rb"\d{19}")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse one JSON document; raises :data:`DecodeError` (a ``ValueError``) when invalid."""
    raw = data.encode() if isinstance(data, str) else data
    if _LONG_DIGITS.search(raw) is None:
        return orjson.loads(raw)
    value = orjson.loads(raw)  # validates exactly as orjson does (UTF-8, no NaN, depth)
    if not _has_inexact_number(value):
        return value
    try:
        return json.loads(bytes(raw).decode(), parse_constant=_no_constants)
    except RecursionError:  # nested deeper than the standard parser goes: orjson's reading
        return value


def _has_inexact_number(value: Any) -> bool:
    """Whether orjson's result holds a float, which may be a rounded huge integer."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def dumps(value: Any, *, indent: bool = False, sort_keys: bool = False) -> bytes:
    """Serialise ``value`` compactly (or indented by two spaces) as UTF-8 JSON."""
    option = (orjson.OPT_INDENT_2 if indent else 0) | (orjson.OPT_SORT_KEYS if sort_keys else 0)
    try:
        return orjson.dumps(value, option=option)
    except orjson.JSONEncodeError:
        if not _has_huge_int(value):
            raise
    text = json.dumps(
        value,
        ensure_ascii=False,
        allow_nan=False,
        sort_keys=sort_keys,
        indent=2 if indent else None,
        separators=(",", ": ") if indent else (",", ":"),
    )
    return text.encode()


def _has_huge_int(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool):
            if not -(2**63) <= item < 2**64:
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False
