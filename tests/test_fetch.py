"""Reading many states concurrently: a bounded pool, results in order, the same requests."""

from __future__ import annotations

import threading
import time

import pytest

from mapper_state.core import state
from mapper_state.ops import commands as ops
from mapper_state.ops.fetch import WORKERS, fetch_all
from mapper_state.stores.base import Blob
from mapper_state.stores.memory import MemoryStore


class SlowReads(MemoryStore):
    """A store whose reads take a while, recording how many are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.peak = 0
        self.reads = 0
        self._count = threading.Lock()

    def read(self, key: str) -> Blob | None:
        with self._count:
            self.in_flight += 1
            self.reads += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            time.sleep(0.01)
            return super().read(key)
        finally:
            with self._count:
                self.in_flight -= 1


def test_export_reads_concurrently_in_order_with_one_read_per_state() -> None:
    store = SlowReads()
    ids = [f"id-{n:03d}" for n in range(60)]
    for n, state_id in enumerate(reversed(ids)):
        state.save(store, state_id, {"bookmarks": {"s": n}}, None)
    store.reads = 0
    exported = list(ops.export_states(store))
    assert [i for i, _ in exported] == ids  # in state ID order
    assert [v for _, v in exported] == [{"bookmarks": {"s": 59 - n}} for n in range(60)]
    assert store.reads == 60
    # reads overlapped (measured by the store, not by a clock: the machine may be busy)
    assert 1 < store.peak <= WORKERS


def test_the_first_failure_in_order_is_raised_and_the_rest_cancelled() -> None:
    started: list[int] = []

    def fetch(n: int) -> int:
        started.append(n)
        if n == 3:
            raise ValueError("three")
        time.sleep(0.01)
        return n

    results: list[int] = []

    def consume() -> None:
        for _, r in fetch_all(range(1000), fetch, workers=4):
            results.append(r)

    with pytest.raises(ValueError, match="three"):
        consume()
    assert results == [0, 1, 2]
    assert len(started) < 1000
