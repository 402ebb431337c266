"""SIGINT and SIGTERM: raised as exceptions where cleanup can run, held off where it cannot.

``raising()`` turns both into :class:`Interrupted` in the main thread so ``finally``
blocks release the lease. ``deferred()`` holds them back for the few steps that
must not be cut in half (creating the lease object and remembering that we did):
a signal that arrives meanwhile is delivered right after. ``wake_main()`` lets a
background thread (the heartbeat, on losing the lease) interrupt the main thread
even while it waits in a read, through ``raising(wake=...)``.

``HELD`` is the cheap form of ``deferred()`` for the hot path: the main thread takes a
lock shared with a background thread (offering a state to the checkpointer) inside
``with signals.HELD:``. An exception raised by a signal handler between a lock's
acquisition and the start of its ``with`` block would leave the lock held for good, and
the run would hang at exit waiting for it; under ``HELD`` the handler only notes the
signal, and it is raised when the block ends, with the lock released.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mapper_state.errors import Interrupted

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
WAKE_SIGNAL = signal.SIGUSR1
_wake_installed = False


@contextmanager
def raising(wake: Callable[[], None] | None = None) -> Iterator[None]:
    """SIGINT/SIGTERM raise :class:`Interrupted`; ``wake_main()`` runs ``wake`` (which may raise)."""
    global _wake_installed

    def handler(signum: int, frame: object) -> None:
        if HELD.depth:
            HELD.noted = signum  # raised when the held block ends
            return
        raise Interrupted(signum)

    def on_wake(signum: int, frame: object) -> None:
        if wake is not None:
            wake()

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    previous[WAKE_SIGNAL] = signal.signal(WAKE_SIGNAL, on_wake)
    _wake_installed = True
    try:
        yield
    finally:
        _wake_installed = False
        for s, h in previous.items():
            signal.signal(s, h)


class _Held:
    """``with HELD:`` a stop signal arriving in the block is raised at its end. Signal
    handlers run in the main thread only, so in any other thread this does nothing."""

    def __init__(self) -> None:
        self.depth = 0
        self.noted: int | None = None
        self._main = threading.main_thread().ident

    def __enter__(self) -> None:
        if threading.get_ident() == self._main:
            self.depth += 1

    def __exit__(self, *exc: object) -> None:
        if threading.get_ident() != self._main:
            return
        self.depth -= 1
        if not self.depth and self.noted is not None:
            signum, self.noted = self.noted, None
            raise Interrupted(signum)


HELD = _Held()


def wake_main() -> None:
    """From a background thread: interrupt the main thread, if it is ready to be woken."""
    if _wake_installed:
        signal.pthread_kill(threading.main_thread().ident or 0, WAKE_SIGNAL)


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
