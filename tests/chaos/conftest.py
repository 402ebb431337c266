"""Fixtures of the chaos suite: the budget, the figures, and stores behind a fault proxy.

Every test collected from ``tests/chaos`` is marked ``chaos`` (and the ones that run
the real Singer tools also ``e2e``).

**Budget.** The default is small, for CI (``make test`` runs everything); ``make chaos``
sets ``MAPPER_STATE_CHAOS=full``. Single figures can be set on their own:

=================================  ===================================  ====  =====
variable                           what                                 ci    full
=================================  ===================================  ====  =====
``MAPPER_STATE_CHAOS_PROCESSES``   holders racing for one lease         8     8
``MAPPER_STATE_CHAOS_ROUNDS``      rounds per holder (the Lease class)  5     200
``MAPPER_STATE_CHAOS_CLI_ROUNDS``  rounds per holder (``mapper-state    2     20
                                   run`` as the holder)
``MAPPER_STATE_CHAOS_FAULT_RUNS``  filter runs through a faulty proxy,  2     200
                                   per store
``MAPPER_STATE_CHAOS_KILL_ROUNDS`` SIGKILL rounds in the real pipeline  3     50
``MAPPER_STATE_CHAOS_EXAMPLES``    hypothesis examples per property     100   2000
=================================  ===================================  ====  =====

**One store.** ``MAPPER_STATE_CHAOS_STORE=<name>`` (``make chaos STORE=<name>``) keeps the
tests of that store only (``file``, ``s3``, ``rgw``, ``azure``, ``gcs``, ``postgres``; a test
that names no store runs with ``file``). PostgreSQL joins the stores of the suite at the
full budget or when it is the one store asked for.

**Figures.** With ``MAPPER_STATE_CHAOS_REPORT=FILE`` each test appends one JSON line to
FILE: what it tried, how often, on which store, what it found lost (``make chaos``
prints them as a table with ``python -m tests.chaos.report FILE``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.proxy import FaultProxy, ProxyUnavailable
from tests.proxy.pool import ProxyPool
from tests.servers import Emulator, StoreLocation, running_azurite

CHAOS_DIR = Path(__file__).resolve().parent
FULL = os.environ.get("MAPPER_STATE_CHAOS", "").lower() == "full"

_DEFAULTS = {  # name: (ci, full)
    "processes": (8, 8),
    "rounds": (5, 200),
    "cli_rounds": (2, 20),
    "fault_runs": (2, 200),
    "kill_rounds": (3, 50),
    "examples": (100, 2000),
}


def _figure(name: str) -> int:
    ci, full = _DEFAULTS[name]
    raw = os.environ.get(f"MAPPER_STATE_CHAOS_{name.upper()}")
    return int(raw) if raw else (full if FULL else ci)


@dataclass(frozen=True)
class ChaosBudget:
    """How much of each kind of chaos to run (see the module docstring)."""

    processes: int
    rounds: int
    cli_rounds: int
    fault_runs: int
    kill_rounds: int
    examples: int
    full: bool


BUDGET = ChaosBudget(**{name: _figure(name) for name in _DEFAULTS}, full=FULL)

settings.register_profile(
    "chaos",
    max_examples=BUDGET.examples,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    print_blob=True,
)
settings.load_profile("chaos")


@pytest.fixture(scope="session")
def chaos_budget() -> ChaosBudget:
    return BUDGET


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test collected from tests/chaos ``chaos``; an ``e2e`` one stays ``e2e``.
    With ``MAPPER_STATE_CHAOS_STORE``, deselect the chaos tests of the other stores."""
    keep, drop = [], []
    for item in items:
        if CHAOS_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.chaos)
            if ONE_STORE is not None and store_of(item) != ONE_STORE:
                drop.append(item)
                continue
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# -- figures ---------------------------------------------------------------------------


def record_figures(test: str, store: str, **figures: Any) -> None:
    """Append one line of figures to ``$MAPPER_STATE_CHAOS_REPORT`` (if set)."""
    path = os.environ.get("MAPPER_STATE_CHAOS_REPORT")
    if not path:
        return
    line = json.dumps(
        {"test": test, "store": store, "budget": "full" if FULL else "ci", **figures},
        sort_keys=True,
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(line + "\n")


# -- stores behind the fault proxy ---------------------------------------------------------


@pytest.fixture
def start_proxy(proxy_pool: ProxyPool) -> Iterator[Any]:
    """``start_proxy(location, seed=..., faults=...)``: a proxy in front of the location's
    emulator, returned with the location as reached through it; the proxy is this test's
    alone, as if just started with ``seed`` and ``faults`` (reused from ``proxy_pool``),
    and goes back to the pool at the end."""
    running: list[FaultProxy] = []

    def start(
        location: StoreLocation, *, seed: int = 0, faults: dict[str, Any] | None = None
    ) -> tuple[FaultProxy, StoreLocation]:
        try:
            proxy = proxy_pool.acquire(location.emulator.endpoint, seed=seed, faults=faults)
        except ProxyUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)
        running.append(proxy)
        return proxy, location.reached_at(location.emulator.endpoint, proxy.url)

    yield start
    for proxy in running:
        proxy_pool.release(proxy)


#: What a deadline test allows past the deadline the docs promise (a third of the TTL per
#: store call), counted from the moment the call's first request reached the server to the
#: process's exit: printing the error and the interpreter's exit. The process's start-up
#: and the SDK's import come before that request and are not counted, so a busy machine's
#: slow start-up is not taken for a store call past its deadline. Measured on this 2-core
#: machine, a black-holed `state get` (deadline 3 s) exits 0.25-0.3 s past the deadline
#: when idle and 0.5-0.7 s past it beside six busy loops.
EXIT_MARGIN = 1.5


CLOUD = ("s3", "rgw", "azure", "gcs")  # rgw: Ceph's RADOS Gateway, a second real S3
ONE_STORE = os.environ.get("MAPPER_STATE_CHAOS_STORE", "").lower() or None
STORES: tuple[str, ...] = ("file", *CLOUD)
if FULL or ONE_STORE == "postgres":
    STORES = (*STORES, "postgres")
#: Parameter values that name a store, as the tests spell them.
_STORE_NAMES = {
    "local": "file",
    "s3_location": "s3",
    "rgw_location": "rgw",
    "s3rver_location": "s3rver",
    "azure_location": "azure",
    "gcs_location": "gcs",
    "pg_location": "postgres",
}


def store_of(item: pytest.Item) -> str:
    """The store a collected test runs on (``file`` when it names none)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for value in params.values():
        if isinstance(value, str) and value in (*STORES, *_STORE_NAMES, "s3rver"):
            return _STORE_NAMES.get(value, value)
    fixtures = getattr(item, "fixturenames", ())
    for fixture, name in _STORE_NAMES.items():
        if fixture in fixtures:
            return name
    return "s3" if "s3_location" in fixtures else "file"


@pytest.fixture
def azurite_server(azurite_server: Emulator) -> Iterator[Emulator]:
    """At the full budget, a fresh Azurite for every test; otherwise the session's.

    Azurite 3.35 (in memory) stopped answering, spinning a core, 45 s into the 160 racing
    ``mapper-state run``s of the full budget, after 3,200 holds and 7,234 injected faults
    in the same process; the same test on a fresh Azurite passes.
    """
    if not FULL:
        yield azurite_server
        return
    with running_azurite() as fresh:
        yield fresh


@pytest.fixture
def cloud_location(request: pytest.FixtureRequest) -> StoreLocation:
    """A fresh location on the emulator named by the test's ``store`` parameter."""
    return location_for(request, request.param)


def location_for(request: pytest.FixtureRequest, kind: str) -> StoreLocation:
    if kind == "postgres":
        return PostgresChaosLocation.of(request.getfixturevalue("pg_location"))
    fixture = {
        "s3": "s3_location",
        "rgw": "rgw_location",
        "azure": "azure_location",
        "gcs": "gcs_location",
    }[kind]
    location: StoreLocation = request.getfixturevalue(fixture)
    return location


def a_location(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> StoreLocation:
    """A fresh location on the store ``kind`` (a directory under ``tmp_path`` for ``file``);
    the test is marked ``cloud`` when it is an emulator's."""
    if kind == "file":
        return file_location(tmp_path / "store")
    request.applymarker(pytest.mark.cloud)
    return location_for(request, kind)


@pytest.fixture(params=STORES)
def each_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreLocation:
    """A fresh location on each of :data:`STORES` in turn: the test runs once a store."""
    return a_location(request, request.param, tmp_path)


def file_location(root: Path) -> StoreLocation:
    """A local directory as a :class:`StoreLocation`, for tests that treat every store alike."""
    emulator = Emulator("file", "file", "file", endpoint=str(root))
    return FileLocation(emulator, str(root), "")


class FileLocation(StoreLocation):
    """A local-file store: ``uri`` is ``file:///root``."""

    @property
    def uri(self) -> str:
        return f"file://{self.bucket}"


def elapsed_since(start: float) -> float:
    return time.monotonic() - start


@dataclasses.dataclass(frozen=True)
class PostgresChaosLocation(StoreLocation):
    """A PostgreSQL table (``tests/pg.py``) as a :class:`StoreLocation`, for the tests that
    treat every store alike."""

    pg: Any = None

    @classmethod
    def of(cls, pg: Any) -> PostgresChaosLocation:
        emulator = Emulator("postgres", "postgresql", "postgres", endpoint=pg.uri)
        return cls(emulator, pg.table, "", pg)

    @property
    def uri(self) -> str:
        return str(self.pg.uri)

    @property
    def options(self) -> dict[str, str]:
        return dict(self.pg.options)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.pg.env)

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.pg.config)

    def open(self, uri: str | None = None, **overrides: str) -> Any:
        return self.pg.open(uri, **overrides)
