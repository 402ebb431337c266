"""Bounded retries for the cloud stores' transient failures.

A store call can fail for reasons that go away on their own: a 5xx, throttling,
a reset connection, a timeout. The stores retry those here, with exponential
backoff and full jitter (each pause is random between zero and the current
ceiling, so many clients retrying at once spread out), and give up once a
deadline has passed so a dead endpoint costs bounded time. Which failures are
transient is the caller's decision: this module knows no SDK.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from mapper_state.stores.base import StoreTraits

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_DEADLINE_SECONDS = 30.0


class RetryDeadline:
    """``retry_deadline_seconds`` for a store whose calls retry: read from its
    :class:`~mapper_state.stores.base.StoreTraits` (fixed when it is opened), this module's
    default when unset."""

    traits: StoreTraits

    @property
    def retry_deadline_seconds(self) -> float:
        """Seconds within which every call gives up, retries included."""
        return self.traits.retry_deadline_seconds or DEFAULT_DEADLINE_SECONDS


class RetryStats:
    """What :func:`retrying` did: attempts made and whether any of them failed transiently.

    A conditional write that failed transiently may still have been applied by the
    server (the response was lost), so a store checks ``retried`` before trusting a
    later "precondition failed".
    """

    def __init__(self) -> None:
        self.attempts = 0
        self.started = time.monotonic()

    @property
    def retried(self) -> bool:
        return self.attempts > 1

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def summary(self) -> str:
        """``"after 4 attempts in 7.1 s"``, for the message of the error that ended it."""
        if self.attempts <= 1:
            return ""
        return f" after {self.attempts} attempts in {self.elapsed:.1f} s"


def backoff_delay(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Full jitter: uniform in ``[0, min(cap, base * 2**(attempt-1))]`` for attempt 1, 2, ..."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return (rng or random).uniform(0, ceiling)


@dataclass(frozen=True)
class RetryPolicy:
    """How :func:`retrying` retries: within ``deadline_seconds`` and ``max_attempts``, pausing
    with full jitter between ``base_delay`` and ``max_delay``; ``sleep`` and ``clock`` are
    the real ones except in tests of the policy itself."""

    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS
    max_attempts: int = 10
    base_delay: float = 0.2
    max_delay: float = 5.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


def retrying(
    fn: Callable[[], T],
    *,
    is_transient: Callable[[BaseException], bool],
    what: str,
    policy: RetryPolicy = RetryPolicy(),
    stats: RetryStats | None = None,
) -> T:
    """Call ``fn`` until it succeeds, fails permanently, or time or attempts run out.

    The last exception propagates unchanged; the caller turns it into a store error
    (``stats`` tells it how many attempts were made and for how long). ``what`` names
    the operation (``"put s3://bucket/key"``) in the debug log of each retry.
    No pause ever runs past the deadline.
    """
    stats = stats if stats is not None else RetryStats()
    deadline = policy.clock() + max(0.0, policy.deadline_seconds)
    while True:
        stats.attempts += 1
        try:
            return fn()
        except BaseException as exc:
            if not isinstance(exc, Exception) or not is_transient(exc):
                raise
            remaining = deadline - policy.clock()
            if stats.attempts >= policy.max_attempts or remaining <= 0:
                raise
            ceiling = backoff_delay(stats.attempts, base=policy.base_delay, cap=policy.max_delay)
            pause = min(remaining, ceiling)
            log.debug(
                "%s failed (%s), retry %d in %.2f s",
                what,
                type(exc).__name__,
                stats.attempts,
                pause,
            )
            policy.sleep(pause)
