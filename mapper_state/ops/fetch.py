"""Reading many objects at once: a bounded pool of concurrent requests, results in order.

Operator commands that read many states (``state export``, ``state list --long``, the
checks before ``state import``) would otherwise wait on one request after another,
while a store answers many at once. At most :data:`WORKERS` requests are in flight
and results come back in the order the items were given, so what a command prints
is exactly what a sequential read would print, only sooner. The request count is
the same as reading one after another.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

WORKERS = 10
"""Requests in flight at once: the SDKs' default HTTP connection pools hold 10."""
_AHEAD = 4
"""How many results per worker may wait, done, for the caller to take them."""


def fetch_all(
    items: Iterable[T], fetch: Callable[[T], R], *, workers: int = WORKERS
) -> Iterator[tuple[T, R]]:
    """``(item, fetch(item))`` for each item, in the items' order, fetched concurrently.

    The first failure (in the items' order) is raised where its result would have
    come; requests not yet started are then cancelled.
    """
    if workers <= 1:
        for item in items:
            yield item, fetch(item)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="fetch")
    window: deque[tuple[T, Future[R]]] = deque()
    try:
        for item in items:
            window.append((item, pool.submit(fetch, item)))
            if len(window) >= workers * _AHEAD:
                first, future = window.popleft()
                yield first, future.result()
        while window:
            first, future = window.popleft()
            yield first, future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
