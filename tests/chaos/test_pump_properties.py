"""Hostile input, by property: whatever the lines and wherever the chunks break, the pump
copies every byte and finds exactly the states a plain line-by-line parser finds.

The lines mix STATE messages (any key order and spacing, escapes, non-ASCII, values of
every JSON kind, long ones), STATE look-alikes (no value, nested, invalid JSON, the word
STATE in a record), records, blank lines, invalid UTF-8, CRLF endings, lines far longer
than the pump's 64 KiB look-ahead, and a last line with no newline. The reference parser
splits on ``\\n`` and calls a line a STATE message when it is a JSON object whose
top-level ``type`` is ``"STATE"`` and which has a ``value``.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mapper_state.stream.pump import HEAD_LIMIT, LineScanner, pump
from tests.chaos.conftest import BUDGET
from tests.helpers import MAPPER, clean_env

# -- the lines ---------------------------------------------------------------------------

INT64 = 2**63 - 1
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-INT64, INT64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["STATE", '"STATE"', "type", "\n", "\r\n", "\\", '"', "\u2028", "☃"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def json_object(draw: st.DrawFn, fields: dict[str, Any]) -> bytes:
    """``fields`` as a JSON object with random key order, spacing and escaping."""
    items = list(fields.items())
    items = draw(st.permutations(items))
    ascii_only = draw(st.booleans())
    space = draw(st.sampled_from(["", " ", "  ", "\t"]))
    parts = [
        json.dumps(k, ensure_ascii=ascii_only)
        + space
        + ":"
        + space
        + json.dumps(v, ensure_ascii=ascii_only)
        for k, v in items
    ]
    return (space + "{" + space + ("," + space).join(parts) + space + "}").encode()


def state_message(value: Any) -> st.SearchStrategy[bytes]:
    return json_object({"type": "STATE", "value": value})


long_text = st.integers(HEAD_LIMIT - 10, HEAD_LIMIT * 3).map(lambda n: "x" * n)

lines = st.one_of(
    values.flatmap(state_message),
    long_text.flatmap(lambda t: json_object({"type": "STATE", "value": {"long": t}})),
    long_text.flatmap(
        lambda t: json_object({"type": "RECORD", "stream": "s", "record": {"t": t, "k": "STATE"}})
    ),
    values.flatmap(
        lambda v: json_object(
            {"type": "RECORD", "stream": "STATE", "record": {"type": "STATE", "value": v}}
        )
    ),
    json_object({"type": "STATE"}),  # no value
    json_object({"type": "SCHEMA", "stream": "s", "schema": {}, "key_properties": []}),
    values.map(lambda v: orjson.dumps([{"type": "STATE", "value": v}])),  # not an object
    values.map(lambda v: orjson.dumps({"type": "STATE", "value": v})[:-1]),  # cut short
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),  # anything, invalid UTF-8 too
    st.binary(max_size=10).map(
        lambda b: b'{"type": "STATE", "value": "\xff' + b.replace(b"\n", b"") + b'"}'
    ),
    st.sampled_from([b"", b" ", b"\r", b"STATE", b'"STATE"', b'{"type":"STATE","value":1}\r']),
)


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    body = draw(st.lists(lines, max_size=30))
    endings = [draw(st.sampled_from([b"\n", b"\r\n"])) for _ in body]
    data = b"".join(line + end for line, end in zip(body, endings, strict=True))
    no_final_newline: bool = draw(st.booleans())
    if body and no_final_newline:
        data = data[: -len(endings[-1])]  # no final newline
    return data


@st.composite
def chunked(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """A stream and a split of it into chunks at random places (some of a single byte)."""
    data = draw(streams())
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=40))))
    bounds = [0, *cuts, len(data)]
    return data, [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


# -- the reference ---------------------------------------------------------------------------


def reference_states(data: bytes) -> list[Any]:
    """What a plain parser finds: each line that is a JSON object with type STATE and a value."""
    found = []
    for line in data.split(b"\n"):
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(message, dict) and message.get("type") == "STATE" and "value" in message:
            found.append(message["value"])
    return found


SINGER_TYPES = ("STATE", "RECORD", "SCHEMA", "ACTIVATE_VERSION", "BATCH")


def reference_bare_states(data: bytes) -> list[Any]:
    """After the target: each non-blank line that is a JSON object is a state, except that a
    Singer STATE message (a target echoing its input) gives its value, and any other Singer
    message (or a STATE without a value) gives nothing."""
    found = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(value, dict):
            continue
        kind = value.get("type")
        if kind == "STATE" and "value" in value:
            found.append(value["value"])
        elif not (isinstance(kind, str) and kind in SINGER_TYPES):
            found.append(value)
    return found


# -- the properties ------------------------------------------------------------------------


@given(chunked())
@example((b'{"type":"STATE","value":1}', [b'{"type":"ST', b'ATE","value":1}']))
@example(
    (
        b'{"type": "RECORD", "x": "STATE"}\n{"value": 2, "type": "STATE"}',
        [b"{", b'"type": "RECORD", "x": "STATE"}\n{"value": 2, "type": "STATE"}'],
    )
)
def test_the_scanner_finds_what_a_line_parser_finds(case: tuple[bytes, list[bytes]]) -> None:
    data, chunks = case
    found: list[Any] = []
    scanner = LineScanner(found.append, lambda message: None)
    for chunk in chunks:
        scanner.feed(bytearray(chunk) + b"junk-after-end", len(chunk))  # the buffer is reused
    scanner.finish()
    assert found == reference_states(data)


@given(chunked())
@example((b'{"type":"STATE","value":null}\n', [b'{"type":"STATE","value":null}\n']))
@example((b'{"type":[1]}\n{"type":"RECORD"}\n7\n', [b'{"type":[1]}\n{"type":"RECORD"}\n7\n']))
def test_after_the_target_each_json_object_line_is_a_state(case: tuple[bytes, list[bytes]]) -> None:
    data, chunks = case
    found: list[Any] = []
    scanner = LineScanner(found.append, lambda message: None, after_target=True)
    for chunk in chunks:
        scanner.feed(chunk)
    scanner.finish()
    assert found == reference_bare_states(data)


def _pump_through_pipes(chunks: list[bytes]) -> tuple[bytes, list[Any]]:
    """Run the real pump between two pipes, the writer sending ``chunks`` one write each."""
    src_r, src_w = os.pipe()
    dst_r, dst_w = os.pipe()
    output = bytearray()

    def write() -> None:
        with open(src_w, "wb", buffering=0) as f:
            for chunk in chunks:
                f.write(chunk)

    def read() -> None:
        with open(dst_r, "rb", buffering=0) as f:
            while block := f.read(1 << 20):
                output.extend(block)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    found: list[Any] = []
    try:
        pump(src_r, dst_w, LineScanner(found.append, lambda message: None))
    finally:
        os.close(src_r)
        os.close(dst_w)
        for t in threads:
            t.join()
    return bytes(output), found


@given(chunked())
def test_the_pump_copies_every_byte_and_finds_every_state(case: tuple[bytes, list[bytes]]) -> None:
    data, chunks = case
    output, found = _pump_through_pipes(chunks)
    assert output == data
    assert found == reference_states(data)


@settings(max_examples=max(3, BUDGET.examples // 30))
@given(streams())
def test_the_command_passes_every_byte_and_stores_the_last_state(
    tmp_path_factory: Any, data: bytes
) -> None:
    """The same through the real ``mapper-state`` filter on a local store."""
    store = Path(tmp_path_factory.mktemp("store"))
    proc = subprocess.run(
        [MAPPER, "--state-id", "chaos:pump", "--state-backend-uri", f"file://{store}",
         "--checkpoint-interval-seconds", "3600"],
        input=data, capture_output=True, env=clean_env(), timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr.decode(errors="replace")
    assert proc.stdout == data
    expected = reference_states(data)
    path = store / "chaos:pump" / "state.json"
    if not expected or all(_no_bookmarks(v) for v in expected):
        return  # the guard may keep no state, or keep the prior one: only the stream is checked
    assert path.exists()
    stored = json.loads(path.read_bytes())["completed"]["singer_state"]
    assert stored == expected[-1] or _no_bookmarks(expected[-1])


def _no_bookmarks(value: Any) -> bool:
    return not (isinstance(value, dict) and value.get("bookmarks"))
