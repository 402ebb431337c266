"""The byte pump: every input byte reaches the output unchanged and in order.

The hot path is large ``os.read``/``os.write`` calls on raw file descriptors;
the only per-chunk work is a ``bytes.find`` for ``"STATE"`` (a regex search for
``"type": "STATE"`` in chunks where that word is common). Only lines holding
the token are cut out and parsed, and a line is buffered across chunks only
while it may still be a STATE message, so a 200 MB RECORD line costs no memory.
A state is handed on only after the bytes carrying it were written downstream.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mapper_state import jsonio, signals
from mapper_state.errors import DownstreamClosed
from mapper_state.fdio import write_all

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20
TOKEN = b'"STATE"'
# How much of an incomplete line we keep before deciding from its head whether
# it can still be a STATE message.
HEAD_LIMIT = 1 << 16
# Scanning for the token: memchr for its rare first letter runs far faster than a
# substring search, and is used until a chunk shows that letter to be common.
_LEAD = b"S"
_MAX_FALSE_LEADS = 32
# After this many lines holding the token in one chunk, the rest of the chunk is searched
# for ``"type": "STATE"`` instead, so records that merely contain the word cost no parse.
_MAX_TOKEN_LINES = 16
_TYPE_FIRST = re.compile(rb'\s*\{\s*"type"\s*:\s*"((?:[^"\\]|\\.)*)"')
_LOOKS_LIKE_STATE = re.compile(rb'"type"\s*:\s*"STATE"')

OnState = Callable[[Any], None]
OnBad = Callable[[str], None]


@dataclass
class PumpStats:
    bytes: int = 0
    states: int = 0


def enlarge_pipe(fd: int) -> None:
    """Ask for a bigger kernel pipe buffer: fewer, larger reads and writes."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):
        pass  # not Linux, or over /proc/sys/fs/pipe-max-size: keep the default


def write_downstream(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to the target; a closed pipe is :class:`DownstreamClosed`."""
    try:
        write_all(fd, data)
    except BrokenPipeError:
        raise DownstreamClosed("the target closed its input before the stream ended") from None
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            raise DownstreamClosed("the target closed its input before the stream ended") from None
        raise


def find_token(buf: bytes | bytearray, start: int, end: int) -> int:
    """Where ``"STATE"`` starts in ``buf[start:end]``, or -1; as ``buf.find(TOKEN, ...)``."""
    pos = buf.find(_LEAD, start + 1, end)
    false_leads = 0
    while pos >= 0:
        if buf.startswith(TOKEN, pos - 1, end):
            return pos - 1
        false_leads += 1
        if false_leads > _MAX_FALSE_LEADS:  # a letter common in this data: search plainly
            return buf.find(TOKEN, pos, end)
        pos = buf.find(_LEAD, pos + 1, end)
    return -1


def cannot_be_state(head: bytes) -> bool:
    """True when an incomplete line's head rules out a STATE message (type given first)."""
    stripped = head.lstrip()
    if stripped and not stripped.startswith(b"{"):
        return True
    m = _TYPE_FIRST.match(head)
    return m is not None and m.group(1) != b"STATE"


class LineScanner:
    """Finds STATE messages in the chunks of a stream, whatever the chunk boundaries."""

    def __init__(self, on_state: OnState, on_bad: OnBad, after_target: bool = False) -> None:
        self.on_state = on_state
        self.on_bad = on_bad
        self.after_target = after_target
        self.carry = bytearray()  # start of the current incomplete line
        self.discarding = False  # the current incomplete line cannot be a STATE message
        self.states = 0

    def feed(self, chunk: bytes | bytearray, end: int | None = None) -> None:
        """Scan ``chunk[:end]``; the buffer may be reused by the caller afterwards."""
        end = len(chunk) if end is None else end
        first_nl = chunk.find(b"\n", 0, end)
        if first_nl < 0:
            self._extend_carry(chunk[:end])
            return
        # the line in progress ends in this chunk
        if self.discarding:
            self.discarding = False
        elif self.carry:
            self.carry += chunk[:first_nl]
            self._line(bytes(self.carry))
            self.carry.clear()
        else:
            self._line(chunk[:first_nl])
        last_nl = chunk.rfind(b"\n", 0, end)
        if self.after_target:
            if last_nl > first_nl:
                for line in chunk[first_nl + 1 : last_nl].split(b"\n"):
                    self._line(line)
        else:
            self._scan_complete_lines(chunk, first_nl + 1, last_nl)
        self._extend_carry(chunk[last_nl + 1 : end])

    def _scan_complete_lines(self, chunk: bytes | bytearray, start: int, end: int) -> None:
        pos = find_token(chunk, start, end)
        candidates = 0
        while pos >= 0:
            line_start = chunk.rfind(b"\n", start, pos) + 1 or start
            line_end = chunk.find(b"\n", pos, end + 1)
            self._line(chunk[line_start:line_end])
            candidates += 1
            if candidates >= _MAX_TOKEN_LINES:
                self._scan_by_type(chunk, line_end, end)
                return
            pos = find_token(chunk, line_end, end)

    def _scan_by_type(self, chunk: bytes | bytearray, start: int, end: int) -> None:
        """The rest of a chunk where ``"STATE"`` is common: only ``"type": "STATE"`` lines.

        Records whose values say ``"STATE"`` are then skipped by one regex scan in C,
        not cut out and parsed one by one.
        """
        search = _LOOKS_LIKE_STATE.search
        m = search(chunk, start, end)
        while m is not None:
            pos = m.start()
            line_start = chunk.rfind(b"\n", start, pos) + 1 or start
            line_end = chunk.find(b"\n", pos, end + 1)
            self._line(chunk[line_start:line_end])
            m = search(chunk, line_end, end)

    def _extend_carry(self, piece: bytes | bytearray) -> None:
        if self.discarding or not piece:
            return
        self.carry += piece
        if (
            len(self.carry) > HEAD_LIMIT
            and not self.after_target
            and cannot_be_state(bytes(self.carry[:HEAD_LIMIT]))
        ):
            self.carry.clear()
            self.discarding = True

    def finish(self) -> None:
        """The stream ended: a last line without a newline still counts."""
        if self.carry and not self.discarding:
            self._line(bytes(self.carry))
        self.carry.clear()
        self.discarding = False

    def _line(self, line: bytes | bytearray) -> None:
        if self.after_target:
            self._bare_state(line)
        elif TOKEN in line:
            self._message(line)

    def _message(self, line: bytes | bytearray) -> None:
        try:
            message = jsonio.loads(line)
        except jsonio.DecodeError:
            if _LOOKS_LIKE_STATE.search(line):
                self.on_bad("a STATE-looking line is not valid JSON; passed through, not stored")
            return
        if not isinstance(message, dict) or message.get("type") != "STATE":
            return
        if "value" not in message:
            self.on_bad("a STATE message has no value; passed through, not stored")
            return
        self.states += 1
        self.on_state(message["value"])

    def _bare_state(self, line: bytes | bytearray) -> None:
        if not line.strip():
            return
        try:
            value = jsonio.loads(line)
        except jsonio.DecodeError:
            self.on_bad("a line from the target is not a JSON state; passed through, not stored")
            return
        if isinstance(value, dict) and value.get("type") == "STATE" and "value" in value:
            value = value["value"]  # a target that echoes Singer STATE messages: their value
        elif not isinstance(value, dict) or _singer_type(value.get("type")):
            self.on_bad(_not_a_state(value))
            return
        self.states += 1
        self.on_state(value)


#: Singer message types a target may print on stdout that are not states it confirms.
_SINGER_TYPES = frozenset({"STATE", "RECORD", "SCHEMA", "ACTIVATE_VERSION", "BATCH"})


def _singer_type(kind: object) -> bool:
    """Is ``kind`` (a ``type`` key, which may hold any JSON value) a Singer message type?"""
    return isinstance(kind, str) and kind in _SINGER_TYPES


def _not_a_state(value: object) -> str:
    if isinstance(value, dict):
        return f"the target printed a Singer {value['type']} message, not a state; not stored"
    return "a line from the target is not a JSON object; passed through, not stored"


def pump(
    src_fd: int,
    dst_fd: int,
    scanner: LineScanner,
    check: Callable[[], None] | None = None,
    scan_first: bool = False,
) -> PumpStats:
    """Copy ``src_fd`` to ``dst_fd`` until EOF, feeding every chunk to ``scanner``.

    ``check`` runs once per chunk (not per line) so a lost lease stops the stream.
    A chunk is scanned once it has gone downstream, or before with ``scan_first``: after
    the target every line read is a state the target confirmed, and scanning it first
    means a signal arriving between the two calls cannot drop a state already echoed.
    Raises :class:`DownstreamClosed` when the output pipe breaks.
    """
    enlarge_pipe(src_fd)
    enlarge_pipe(dst_fd)
    stats = PumpStats()
    buffer = bytearray(CHUNK)  # reused: no allocation or page faults per chunk
    view = memoryview(buffer)
    source = open(src_fd, "rb", buffering=0, closefd=False)  # noqa: SIM115
    readinto, feed = source.readinto, scanner.feed
    wait = signals.readable_waiter(src_fd)  # a stop signal must not wait for the next input
    while True:
        if wait is not None:
            wait()
        n = readinto(buffer)
        if not n:
            break
        if scan_first:
            feed(buffer, n)
        write_downstream(dst_fd, view[:n])
        stats.bytes += n
        if not scan_first:
            feed(buffer, n)
        if check is not None:
            check()
    scanner.finish()
    stats.states = scanner.states
    return stats
