"""Reuse running fault proxies between tests instead of starting one per test.

Why it exists: mitmdump spends about 1.3 s of CPU starting up, which was most of what
the fault proxy cost the suite. A :class:`ProxyPool` (one per test process, so one per
xdist worker) keeps the proxies its tests have finished with, one set per upstream, and
hands one out again reconfigured (:meth:`FaultProxy.reconfigure`): the new seed and
faults, the request log and counters empty, so a test cannot tell it from a proxy just
started with that seed. A proxy is handed to one user at a time: a test that asks for
two proxies on the same upstream gets two processes. Returning a proxy drains it (held
requests closed, pending late copies dropped) and checks that nothing is in flight; a
proxy that fails either check is stopped, never reused. Tests that stop or kill their
proxy on purpose start their own :class:`FaultProxy` instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.proxy import FaultProxy

__all__ = ["ProxyPool"]

#: Idle proxies kept at most (the oldest is stopped first): a proxy in front of an
#: emulator that a test started for itself would otherwise wait, useless, to the end.
MAX_IDLE = 6


class ProxyPool:
    """Idle proxies by upstream URL, handed out one user at a time; see the module docstring."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self._idle: list[FaultProxy] = []  # oldest first
        self._max_idle = max_idle
        self.started = 0  # proxies this pool started (the rest of its hand-outs were reuses)

    def acquire(
        self, target_url: str, *, seed: int = 0, faults: dict[str, Any] | None = None
    ) -> FaultProxy:
        """A running proxy in front of ``target_url``, as if just started with ``seed`` and
        ``faults``; the caller gives it back with :meth:`release` when done with it."""
        FaultProxy(target_url, faults=faults, seed=seed)  # check the arguments first
        for proxy in [p for p in self._idle if p.target_url == target_url]:
            self._idle.remove(proxy)
            if proxy.reconfigure(seed=seed, faults=faults):
                return proxy
            proxy.stop()
        proxy = FaultProxy(target_url, faults=faults, seed=seed)
        proxy.start()
        self.started += 1
        return proxy

    @contextlib.contextmanager
    def lease(
        self, target_url: str, *, seed: int = 0, faults: dict[str, Any] | None = None
    ) -> Iterator[FaultProxy]:
        """:meth:`acquire`, then :meth:`release` at the end of the block."""
        proxy = self.acquire(target_url, seed=seed, faults=faults)
        try:
            yield proxy
        finally:
            self.release(proxy)

    def release(self, proxy: FaultProxy) -> None:
        """Take ``proxy`` back once its user is done: drained and idle, or stopped."""
        if not proxy.reconfigure(drain=True):
            proxy.stop()
            return
        self._idle.append(proxy)
        while len(self._idle) > self._max_idle:
            self._idle.pop(0).stop()

    def close(self) -> None:
        """Stop every idle proxy (the end of the test process)."""
        while self._idle:
            self._idle.pop().stop()
