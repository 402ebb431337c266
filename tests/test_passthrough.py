"""Pass-through is sacred: every byte reaches stdout unchanged, whatever the input."""

from __future__ import annotations

import filecmp
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mapper_state.stream.pump import HEAD_LIMIT, LineScanner, find_token
from tests.helpers import MAPPER, clean_env, state_line, stored_state
from tests.support.cli import invoke_filter

HOSTILE_CASES: dict[str, bytes] = {
    "empty": b"",
    "blank lines": b"\n\n\n",
    "no final newline": b'{"type":"RECORD","record":{}}\n{"type":"STATE","value":{"a":1}}',
    "crlf": b'{"type":"RECORD","record":{}}\r\n{"type":"STATE","value":{"a":2}}\r\n',
    "invalid json": b'{"type":"STATE", nope\n{not json}\n',
    "invalid utf-8": b'{"type":"RECORD","record":{"x":"\xff\xfe\xc3\x28"}}\n\xff\xff\n',
    "nul bytes": b'\x00\x00{"type":"RECORD"}\x00\n',
    "state word in a record": b'{"type":"RECORD","record":{"status":"STATE","type":"STATE"}}\n',
    "nested state message": b'{"type":"RECORD","record":{"m":{"type":"STATE","value":{"x":9}}}}\n',
    "unknown types": b'{"type":"ACTIVATE_VERSION","version":1}\n{"type":"BATCH"}\n{"type":"WHAT"}\n',
    "state without value": b'{"type":"STATE"}\n',
    "json array": b'["STATE"]\n',
}


@pytest.mark.parametrize("name", list(HOSTILE_CASES))
def test_hostile_input_passes_through_byte_for_byte(name: str, tmp_path: Path) -> None:
    data = HOSTILE_CASES[name]
    result = invoke_filter("--state-id", "t", cwd=tmp_path, input=data)
    assert result.returncode == 0, result.stderr
    assert result.stdout == data
    assert b"Traceback" not in result.stderr


def test_only_top_level_state_messages_are_stored(tmp_path: Path) -> None:
    data = (
        HOSTILE_CASES["state word in a record"]
        + HOSTILE_CASES["nested state message"]
        + state_line({"real": 1})
        + b'{"type":"STATE","value":{"real":2}}\r\n'
        + HOSTILE_CASES["invalid json"]
    )
    result = invoke_filter("--state-id", "t", cwd=tmp_path, input=data)
    assert result.returncode == 0
    assert result.stdout == data
    assert stored_state(tmp_path / ".mapper-state", "t") == {"real": 2}
    assert b"not valid JSON" in result.stderr


def test_state_on_last_line_without_newline_is_stored(tmp_path: Path) -> None:
    result = invoke_filter("--state-id", "t", cwd=tmp_path, input=HOSTILE_CASES["no final newline"])
    assert result.stdout == HOSTILE_CASES["no final newline"]
    assert stored_state(tmp_path / ".mapper-state", "t") == {"a": 1}


PEAK_RSS = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(proc.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, file=sys.stderr)
"""


def test_huge_lines_pass_through_with_bounded_memory(tmp_path: Path) -> None:
    """A 200 MB RECORD line is passed through; only a possible STATE line is buffered."""
    src = tmp_path / "in.jsonl"
    with src.open("wb") as f:  # written piecewise: this test process stays small
        f.write(state_line({"n": 1}))
        f.write(b'{"type":"RECORD","stream":"s","record":{"blob":"')
        for _ in range(200):
            f.write(b"x" * (1 << 20))
        f.write(b'"}}\n')
        f.write(state_line({"blob": "y" * (30 << 20)}))
        f.write(b"tail without newline")
    out = tmp_path / "out.jsonl"
    with src.open("rb") as stdin, out.open("wb") as stdout:
        # started from a small parent: a child forked from this big test process would
        # count the parent's memory as its own peak
        report = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, MAPPER, "--state-id", "big"],
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
            env=clean_env(),
            check=False,
        )
    code, peak_kib = map(int, report.stderr.split()[-2:])
    assert code == 0, report.stderr
    assert filecmp.cmp(src, out, shallow=False)
    # the 200 MB line was not buffered; the 30 MB STATE line had to be (and parsed)
    assert peak_kib / 1024 < 200
    assert stored_state(tmp_path / ".mapper-state", "big") == {"blob": "y" * (30 << 20)}


# -- property-based: the scanner finds exactly the STATE messages, whatever the chunking --

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
lines = st.one_of(
    json_values.map(lambda v: json.dumps({"type": "STATE", "value": v}).encode()),
    json_values.map(
        lambda v: json.dumps({"type": "RECORD", "record": {"v": v, "t": "STATE"}}).encode()
    ),
    st.binary(max_size=40),
    st.just(b'{"type": "STATE", "value": {"broken"'),
    st.just(b'{"value": {"a": 1}, "type": "STATE"}'),
)


def reference_states(data: bytes) -> list[Any]:
    """The obvious, slow definition: parse every line, keep top-level STATE values."""
    found = []
    for line in data.split(b"\n"):
        try:
            msg = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(msg, dict) and msg.get("type") == "STATE" and "value" in msg:
            found.append(msg["value"])
    return found


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(lines, max_size=30),
    st.sampled_from([b"\n", b"\r\n"]),
    st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=10),
)
def test_scanner_matches_reference_for_any_chunking(
    body: list[bytes], newline: bytes, cuts: list[int]
) -> None:
    data = newline.join(body)
    found: list[Any] = []
    scanner = LineScanner(found.append, lambda _msg: None)
    pos, i = 0, 0
    while pos < len(data):
        size = cuts[i % len(cuts)]
        scanner.feed(data[pos : pos + size])
        pos, i = pos + size, i + 1
    scanner.finish()
    assert found == reference_states(data.replace(b"\r\n", b"\n"))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(lines, min_size=20, max_size=200), st.sampled_from([b"\n", b"\r\n"]))
def test_scanner_matches_reference_where_the_word_state_is_common(
    body: list[bytes], newline: bytes
) -> None:
    """Whole chunks with many lines holding ``"STATE"``: past 16 such lines the rest of a
    chunk is searched for ``"type": "STATE"`` instead, and finds the same states."""
    data = newline.join(body)
    found: list[Any] = []
    scanner = LineScanner(found.append, lambda _msg: None)
    scanner.feed(data)
    scanner.finish()
    assert found == reference_states(data.replace(b"\r\n", b"\n"))


def test_states_after_many_records_saying_state_are_all_found() -> None:
    record = json.dumps({"type": "RECORD", "record": {"status": "STATE"}}).encode()
    states = [{"n": n} for n in range(5)]
    body = [record] * 100
    for n, value in enumerate(states):
        line = b'{"value": ' + json.dumps(value).encode() + b', "type" : "STATE"}'
        body.insert(30 + 10 * n, line)
    found: list[Any] = []
    scanner = LineScanner(found.append, lambda _msg: None)
    scanner.feed(b"\n".join(body) + b"\n")
    scanner.finish()
    assert found == states


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=5000))
def test_cli_passes_arbitrary_bytes(tmp_path: Path, data: bytes) -> None:
    result = invoke_filter("--state-id", "prop", cwd=tmp_path, input=data)
    assert result.returncode == 0, result.stderr
    assert result.stdout == data


def test_long_line_that_may_be_state_is_still_found_across_chunks() -> None:
    value = {"blob": "z" * (HEAD_LIMIT * 3)}
    line = json.dumps({"value": value, "type": "STATE"}).encode() + b"\n"
    found: list[Any] = []
    scanner = LineScanner(found.append, lambda _msg: None)
    for i in range(0, len(line), 4096):
        scanner.feed(line[i : i + 4096])
    scanner.finish()
    assert found == [value]


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.sampled_from([b'"STATE"', b"S", b'"', b"STATE", b"x", b"\n", b'"S']), max_size=80),
    st.integers(min_value=0, max_value=10),
    st.integers(min_value=0, max_value=10),
)
def test_token_search_agrees_with_a_plain_find(parts: list[bytes], lo: int, hi: int) -> None:
    """The memchr-led search finds exactly what ``bytes.find`` finds, however many S's."""
    buf = bytearray(b"".join(parts))
    start, end = min(lo, len(buf)), max(len(buf) - hi, 0)
    assert find_token(buf, start, end) == buf.find(b'"STATE"', start, end)
