"""Handing the locked prior state to the tap through ``--state-file``.

A named pipe (or ``/dev/fd/N``) is opened for writing, which waits until the tap
opens it for reading: the tap in the same shell pipeline then reads the state
only after the lease is ours. A regular path is replaced atomically (mode 0600).
If the run fails before the hand-off, the pipe is still opened and closed empty,
so the tap fails on an empty state instead of hanging.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import threading
import time
from typing import Any

from mapper_state import jsonio
from mapper_state.errors import ConfigError
from mapper_state.fdio import write_all

OPEN_POLL_SECONDS = 0.02


def is_pipe(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def write_file_atomically(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=directory)
    except OSError as exc:
        raise ConfigError(f"cannot write --state-file {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class PipeHandoff:
    """Writes to a named pipe in the background once its reader arrives."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = threading.Event()

    def _open_when_read(self) -> int | None:
        """Open for writing as soon as a reader exists, without blocking forever."""
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                    return None
                time.sleep(OPEN_POLL_SECONDS)
                continue
            os.set_blocking(fd, True)
            return fd
        return None

    def start(self, data: bytes) -> None:
        def deliver() -> None:
            fd = self._open_when_read()
            if fd is None:
                return
            try:
                write_all(fd, data)
            except OSError:
                pass  # the tap went away: its own exit status tells the story
            finally:
                os.close(fd)
                self.delivered.set()

        self._thread = threading.Thread(target=deliver, name="state-handoff", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()


def hand_off(path: str, value: Any) -> PipeHandoff | None:
    """Give ``value`` to the tap at ``path``; for a pipe, return the background writer."""
    data = jsonio.dumps(value)
    if is_pipe(path):
        writer = PipeHandoff(path)
        writer.start(data)
        return writer
    write_file_atomically(path, data)
    return None


def release_reader(path: str, wait_seconds: float = 10.0) -> None:
    """We failed before the hand-off: let a tap waiting on the pipe see EOF and fail."""
    if not is_pipe(path):
        return
    writer = PipeHandoff(path)
    writer.start(b"")
    writer.delivered.wait(wait_seconds)
    writer.stop()
