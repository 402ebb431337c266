"""Writing every byte to a file descriptor: ``os.write`` may write only part of what it is given.

A leaf shared by the pump (the stream to the target), the FIFO hand-off (the state
to the tap) and the file store (the temp file before its rename).
"""

from __future__ import annotations

import os


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to ``fd``; ``OSError`` (a broken pipe included) propagates."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
