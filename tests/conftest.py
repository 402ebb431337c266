"""Shared pytest configuration, and the order the suite runs in: the longest tests first."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.helpers import StoreCli
from tests.proxy.pool import ProxyPool

pytest_plugins = ["tests.servers", "tests.rgw", "tests.pg", "tests.dist"]

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

#: The longest tests (a minute and more each: Meltano's own state tests, whole Meltano runs,
#: the container image, the scoreboard, real plugins, racing processes, servers) start
#: first, in this order; then tests marked ``e2e``, the chaos suite, tests marked ``cloud``,
#: the store suites, the rest.
LONGEST_FIRST = (
    "tests/e2e/test_meltano_own_tests.py",
    "tests/test_container.py",
    "tests/e2e/test_meltano_run_lease.py",
    "tests/test_benchmarks_smoke.py",
    "tests/e2e/test_meltano",
)


def _start_rank(item: pytest.Item) -> int:
    where = _where(item)
    for rank, prefix in enumerate(LONGEST_FIRST):
        if where.startswith(prefix):
            return rank
    later = (
        item.get_closest_marker("e2e") is not None,
        where.startswith("tests/chaos/"),
        item.get_closest_marker("cloud") is not None,
        where.startswith("tests/stores/"),
    )
    return len(LONGEST_FIRST) + next((i for i, hit in enumerate(later) if hit), len(later))


#: Modules whose tests mostly wait, for leases to expire and for answers a fault proxy holds
#: back (measured on 2026-12-03: under a third of a core per test). Run together they leave
#: the cores idle; they are spread evenly among the others instead (:func:`spread`).
MOSTLY_WAITING = (
    "tests/chaos/test_wire_faults.py",
    "tests/chaos/test_expiry_fencing.py",
    "tests/chaos/test_unknown_outcomes.py",
    "tests/chaos/test_delete_conditions.py",
    "tests/stores/",
    "tests/test_store_kit.py",
    "tests/test_fault_proxy.py",
    "tests/test_exec.py",
)


def _where(item: pytest.Item) -> str:
    path = Path(str(item.path)).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else ""


def spread(items: list[T], among: list[T]) -> list[T]:
    """``items`` laid evenly among ``among``, both in their own order: the i-th of n goes at
    (i + 0.5) / n of the way through."""
    placed = [((i + 0.5) / len(among), 0, x) for i, x in enumerate(among)]
    placed += [((i + 0.5) / len(items), 1, x) for i, x in enumerate(items)]
    return [x for *_, x in sorted(placed, key=lambda p: p[:2])]


def dealt(items: list[T], hands: int) -> list[T]:
    """``items`` dealt like cards into ``hands`` runs laid end to end, each in their order.

    pytest-xdist's ``worksteal`` gives each worker one contiguous run of the collection
    (the first third to the first of three workers, and so on), and an idle worker steals
    from the *tail* of another's run. Sorted longest first and not dealt, every long test
    would sit at the head of the first worker's run, to be run one after the other by it
    alone while the others steal its short tail: dealt, each worker starts with its share
    of the long tests. The last hand is dealt first, so that the hands are as long as the
    runs worksteal cuts (it gives the odd items to the last workers).
    """
    if hands <= 1:
        return list(items)
    return [items[i] for hand in reversed(range(hands)) for i in range(hand, len(items), hands)]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first (a stable sort: every worker collects the same order), the mostly
    waiting ones spread among the rest, dealt among the workers of ``-n N``."""
    items.sort(key=_start_rank)
    first = [i for i in items if _start_rank(i) < len(LONGEST_FIRST)]
    rest = items[len(first) :]
    waiting = [i for i in rest if _where(i).startswith(MOSTLY_WAITING)]
    busy = [i for i in rest if not _where(i).startswith(MOSTLY_WAITING)]
    ordered = first + (spread(waiting, busy) if waiting and busy else rest)
    items[:] = dealt(ordered, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


#: ``@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)``: the local store and S3.
ON_BOTH = ["local", pytest.param("s3", marks=pytest.mark.cloud)]


@pytest.fixture
def store_cli(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCli:
    """The real CLI on a local store by default; parametrize indirectly with "s3" for moto."""
    kind = getattr(request, "param", "local")
    if kind == "local":
        return StoreCli.local(tmp_path / "store")
    return StoreCli.cloud(request.getfixturevalue(f"{kind}_location"), tmp_path)


@pytest.fixture(scope="session")
def proxy_pool() -> Iterator[ProxyPool]:
    """The fault proxies this test process reuses (``tests/proxy/pool.py``); stopped at the
    end, and killed with the process if it dies first (``tests/support/processes.py``)."""
    pool = ProxyPool()
    yield pool
    pool.close()
