"""State values survive a write and a read exactly, whatever their numbers.

The CLI test in ``test_filter.py`` sends 2**64 through the filter and back; this checks the
codec itself over any JSON value, against the standard library's reading of the same text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mapper_state import jsonio

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: far beyond 64 bits both ways
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=10,
)


@given(values, st.booleans())
def test_what_is_written_is_read_back_exactly(value: Any, indent: bool) -> None:
    data = jsonio.dumps(value, indent=indent)
    assert jsonio.loads(data) == value
    assert json.loads(data) == value  # and any other reader agrees


@given(values)
def test_any_writers_json_is_read_as_the_standard_library_reads_it(value: Any) -> None:
    text = json.dumps(value)
    assert jsonio.loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize("bad", [b"", b"{", b"NaN", b'{"a": 123456789012345678901234567890,}'])
def test_invalid_json_is_a_decode_error(bad: bytes) -> None:
    with pytest.raises(jsonio.DecodeError):
        jsonio.loads(bad)
