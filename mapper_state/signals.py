"""SIGINT and SIGTERM: raised as exceptions where cleanup can run, held off where it cannot.

``raising()`` turns both into :class:`Interrupted` in the main thread so ``finally``
blocks release the lease. ``deferred()`` holds them back for the few steps that
must not be cut in half (creating the lease object and remembering that we did):
a signal that arrives meanwhile is delivered right after.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from mapper_state.errors import Interrupted

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextmanager
def raising() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def deferred() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
