"""Shared pytest configuration, and the order the suite runs in: the longest tests first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import StoreCli

pytest_plugins = ["tests.servers", "tests.rgw", "tests.pg", "tests.dist"]

ROOT = Path(__file__).resolve().parent.parent

#: The longest tests (a minute and more each: the scoreboard, Meltano, real plugins, racing
#: processes, servers) start first: with ``--dist worksteal`` each worker runs its share
#: from the head and idle workers steal from the tail, so the run does not end with one
#: long test on one core while the others wait. In order: these files, then tests marked
#: ``e2e``, the chaos suite, tests marked ``cloud``, the store suites, the rest.
LONGEST_FIRST = ("tests/test_benchmarks_smoke.py", "tests/e2e/test_meltano")


def _start_rank(item: pytest.Item) -> int:
    path = Path(str(item.path)).resolve()
    where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else ""
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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first (a stable sort: every worker collects the same order)."""
    items.sort(key=_start_rank)


#: ``@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)``: the local store and S3.
ON_BOTH = ["local", pytest.param("s3", marks=pytest.mark.cloud)]


@pytest.fixture
def store_cli(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCli:
    """The real CLI on a local store by default; parametrize indirectly with "s3" for moto."""
    kind = getattr(request, "param", "local")
    if kind == "local":
        return StoreCli.local(tmp_path / "store")
    return StoreCli.cloud(request.getfixturevalue(f"{kind}_location"), tmp_path)
