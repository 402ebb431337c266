"""SIGINT and SIGTERM: raised as exceptions where cleanup can run, held off where it cannot.

``raising()`` turns both into :class:`Interrupted` in the main thread so ``finally``
blocks release the lease. ``deferred()`` holds them back for the few steps that
must not be cut in half (creating the lease object and remembering that we did):
a signal that arrives meanwhile is delivered right after. ``wake_main()`` lets a
background thread (the heartbeat, on losing the lease) interrupt the main thread
even while it waits in a read, through ``raising(wake=...)``.

``waking()`` (entered by ``raising()``) closes the gap every blocking wait has: a signal
that arrives just before the main thread blocks in a read, or that the kernel hands to
another thread, interrupts nothing, and its handler would wait until the read returns,
which on an idle tap may be never. Python also writes each signal to a pipe
(``signal.set_wakeup_fd``); ``wait_readable()`` and ``wait_process()`` wait on that pipe
too, so the handler runs at once however close to the wait the signal came.

``HELD`` is the cheap form of ``deferred()`` for the hot path: the main thread takes a
lock shared with a background thread (offering a state to the checkpointer) inside
``with signals.HELD:``. An exception raised by a signal handler between a lock's
acquisition and the start of its ``with`` block would leave the lock held for good, and
the run would hang at exit waiting for it; under ``HELD`` the handler only notes the
signal, and it is raised when the block ends, with the lock released.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import TYPE_CHECKING, Any

from mapper_state.errors import Interrupted

if TYPE_CHECKING:
    import subprocess

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
WAKE_SIGNAL = signal.SIGUSR1
_wake_installed = False
#: The read end of the pipe each signal is written to while in ``waking()``.
_wakeup_read: int | None = None


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
        with waking():
            yield
    finally:
        _wake_installed = False
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def waking() -> Iterator[None]:
    """While inside (main thread only), ``wait_readable()`` and ``wait_process()`` end their
    wait when a signal with a Python handler arrives, and let the handler run."""
    global _wakeup_read
    if _wakeup_read is not None:
        yield
        return
    with ExitStack() as stack:
        read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        stack.callback(os.close, read_end)
        stack.callback(os.close, write_end)
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        stack.callback(signal.set_wakeup_fd, previous)
        _wakeup_read = read_end
        try:
            yield
        finally:
            _wakeup_read = None


def readable_waiter(fd: int) -> Callable[[], None] | None:
    """A function that returns once ``fd`` has something to read (or its end, or an error),
    after running the handler of any signal that arrived meanwhile (which may raise);
    ``None`` outside ``waking()``, where a plain blocking read is all there is."""
    wake = _wakeup_read
    if wake is None:
        return None
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.register(wake, select.POLLIN)

    def wait() -> None:
        # the handler runs as poll() returns; its byte in the pipe is drained here
        while not any(ready == fd for ready, _ in poller.poll()):
            _drain(wake)

    return wait


def wait_readable(fd: int) -> None:
    """Wait until ``fd`` is readable, acting on signals at once (see :func:`readable_waiter`)."""
    wait = readable_waiter(fd)
    if wait is not None:
        wait()


def wait_process(proc: subprocess.Popen[Any]) -> int:
    """``proc.wait()``, acting on signals at once: a forwarding handler that ran only after
    the child had ended on its own would have forwarded nothing."""
    if _wakeup_read is not None and proc.returncode is None:
        try:
            pidfd = os.pidfd_open(proc.pid)  # readable once the process has ended
        except (AttributeError, OSError):  # before Linux 5.3: a plain wait
            pidfd = None
        if pidfd is not None:
            try:
                wait_readable(pidfd)
            finally:
                os.close(pidfd)
    return proc.wait()


def _drain(fd: int) -> None:
    with suppress(BlockingIOError):
        while os.read(fd, 512):
            pass


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
