"""The deadline a store call must end by, carried with the call.

A caller that needs a store call to end by a given moment (a lease renewal must end
before the lease expires, a read-back of the lease before the run must stop) opens
``with deadline.within(seconds):`` around it. Every store call made inside the block,
on the same thread, gives up by then: its retries, connect and read timeouts and
statement timeout are cut to the time left (each store passes them to its SDK's own
per-call timeout), and a call whose deadline has already passed fails at once with
:class:`DeadlinePassed` without sending anything. Blocks nest: the inner deadline is
never later than the outer one.

The deadline lives in a :class:`contextvars.ContextVar`, so it travels with the call
and no thread is needed to abandon a call that runs late: the call itself ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from mapper_state import runtime
from mapper_state.stores.base import StoreError

_AT: ContextVar[float | None] = ContextVar("mapper_state_store_deadline", default=None)


class DeadlinePassed(StoreError):
    """A store call was asked for after its deadline: nothing was sent."""


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Every store call in the block ends within ``seconds`` from now (or the outer deadline,
    if that is sooner). ``seconds`` may be zero or less: the calls then fail at once."""
    at = runtime.monotonic() + seconds
    outer = _AT.get()
    token = _AT.set(at if outer is None else min(at, outer))
    try:
        yield
    finally:
        _AT.reset(token)


def seconds_left(ceiling: float) -> float:
    """Seconds the call in progress may still take: ``ceiling`` (the store's own limit for
    a call) or less when the caller's deadline is sooner; zero or less once it has passed."""
    at = _AT.get()
    if at is None:
        return ceiling
    return min(ceiling, at - runtime.monotonic())


def check(what: str) -> None:
    """Refuse to start ``what`` (``"replace s3://bucket/key"``) once the deadline has passed."""
    at = _AT.get()
    if at is not None and runtime.monotonic() >= at:
        raise DeadlinePassed(f"{what}: not sent, its deadline had passed")
