"""Time and waiting, in one swappable place: the clocks, sleeps, events, locks and threads
of the lease, its heartbeat, the checkpointer and the store deadlines, and the host name
and pid the lease and run records give.

The safety code never calls :mod:`time` or :mod:`threading` for these directly: it calls
the functions here, which ask the runtime in use. Production uses :data:`REAL` (the
standard library, nothing added). The deterministic simulation of the protocol
(``tests/simulation/``) installs its own runtime with :func:`use`: each simulated process
then has its own skewed, drifting clock, host name and pid, every sleep and wait hands
control to a seeded scheduler, and a schedule that breaks an invariant replays exactly
from its seed, on any machine.

Only blocking waits need to go through here (a lock held across a store call, an event a
thread sleeps on); a lock held for a few statements with nothing blocking inside may stay
a plain :class:`threading.Lock`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time as _time
from collections.abc import Callable, Iterator
from typing import Protocol


class Event(Protocol):
    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Lock(Protocol):
    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...

    def release(self) -> None: ...


class Thread(Protocol):
    def start(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...


class Runtime(Protocol):
    """What the safety code needs of time and threads."""

    def time(self) -> float:
        """The wall clock (seconds since the epoch): lease records' times."""

    def monotonic(self) -> float:
        """A clock that never goes back: deadlines and intervals."""

    def sleep(self, seconds: float) -> None: ...

    def event(self) -> Event: ...

    def lock(self) -> Lock: ...

    def thread(self, target: Callable[[], None], name: str) -> Thread:
        """A daemon thread running ``target`` (not started)."""

    def current_thread(self) -> object:
        """The calling thread, comparable with what :meth:`thread` returned."""

    def host(self) -> str:
        """The host name a lease or run record gives for this process."""

    def pid(self) -> int:
        """The process ID a lease or run record gives for this process."""


class _Real:
    """The standard library's clocks and threads."""

    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)
    sleep = staticmethod(_time.sleep)
    event = staticmethod(threading.Event)
    lock = staticmethod(threading.Lock)
    current_thread = staticmethod(threading.current_thread)
    host = staticmethod(socket.gethostname)
    pid = staticmethod(os.getpid)

    @staticmethod
    def thread(target: Callable[[], None], name: str) -> Thread:
        return threading.Thread(target=target, name=name, daemon=True)


REAL: Runtime = _Real()
_current: Runtime = REAL


@contextlib.contextmanager
def use(runtime: Runtime) -> Iterator[Runtime]:
    """Run the block with ``runtime`` in place of the real one (the simulation's)."""
    global _current
    previous, _current = _current, runtime
    try:
        yield runtime
    finally:
        _current = previous


def current() -> Runtime:
    return _current


def now() -> float:
    """The wall clock of the runtime in use."""
    return _current.time()


def monotonic() -> float:
    return _current.monotonic()


def sleep(seconds: float) -> None:
    _current.sleep(seconds)


def event() -> Event:
    return _current.event()


def lock() -> Lock:
    return _current.lock()


def thread(target: Callable[[], None], name: str) -> Thread:
    return _current.thread(target, name)


def current_thread() -> object:
    return _current.current_thread()


def host() -> str:
    """This process's host name, as the records it writes give it."""
    return _current.host()


def pid() -> int:
    """This process's ID, as the records it writes give it."""
    return _current.pid()
