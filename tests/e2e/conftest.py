"""Fixtures for the end-to-end tests: real tap-postgres, target-jsonl, target-csv, PostgreSQL.

Every test under ``tests/e2e`` is marked ``e2e`` here (``pytest -m e2e`` selects them,
``-m "not e2e"`` skips the slow suite).

* ``postgres`` (session): one throw-away PostgreSQL cluster for the whole session.
* ``source``: a fresh schema holding an ``events`` table (``id``, ``name``,
  ``updated_at``), the tap's config limited to that schema and its catalog, with the
  stream selected for INCREMENTAL replication on ``updated_at``. The catalog is the
  one ``tap-postgres --discover`` gives for the same table, discovered once per
  session, with the schema name changed. Row ``i`` has ``updated_at = 2024-01-01 +
  i minutes``, so "new rows" are simply higher ids.
* ``store``: where mapper-state keeps the state, a local directory by default;
  ``@pytest.mark.parametrize("store", ["local", "s3", "postgres"], indirect=True)`` adds
  a fresh bucket on moto (the ``s3_location`` fixture of ``tests/servers.py``) or a
  fresh table in the cluster the tap reads (``pg_location`` of ``tests/pg.py``).
* ``jsonl`` / ``csv``: the two real targets, one output directory per run.
* ``mapper``: runs the real ``mapper-state`` command with the store's settings in a
  clean environment.
"""

from __future__ import annotations

import copy
import csv as csv_module
import json
import os
import shlex
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import tools
from tests.pg import PostgresLocation, PostgresServer
from tests.servers import StoreLocation
from tests.support.cli import invoke
from tests.support.sdk import object_reader

E2E_DIR = Path(__file__).resolve().parent
BASE_TIME = datetime(2024, 1, 1, tzinfo=UTC)
TABLE = "events"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test collected from tests/e2e (and only those) as ``e2e``."""
    for item in items:
        if E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


# -- rows and bookmarks ----------------------------------------------------------------


def updated_at(row_id: int) -> datetime:
    return BASE_TIME + timedelta(minutes=row_id)


def bookmark(row_id: int) -> str:
    """``replication_key_value`` as tap-postgres writes it for row ``row_id``."""
    return updated_at(row_id).isoformat(timespec="microseconds")


# -- the real tools ----------------------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    tap_postgres: Path
    target_jsonl: Path
    target_csv: Path
    mapper_state: Path


@pytest.fixture(scope="session")
def real_tools() -> Tools:
    """The installed tools; a missing one fails the test with the command that installs it."""
    return Tools(
        tap_postgres=tools.tap_postgres(),
        target_jsonl=tools.target_jsonl(),
        target_csv=tools.target_csv(),
        mapper_state=tools.mapper_state(),
    )


def child_env(**extra: str) -> dict[str, str]:
    """A clean environment for mapper-state and its children, plus ``extra``."""
    env = {
        k: v
        for k, v in tools.tool_env().items()
        if not k.startswith(("AWS_", "AZURE_", "GOOGLE_", "SINGER_"))
    }
    env.update(extra)
    return env


# -- the source: a fresh schema and table, discovered by the real tap ---------------------


@dataclass
class Source:
    """One ``events`` table in its own schema, and the tap's config and catalog for it."""

    pg: PostgresServer
    schema: str
    tap_config: Path
    catalog: Path
    tap: Path

    @property
    def stream(self) -> str:
        return f"{self.schema}-{TABLE}"

    def insert(self, first: int, last: int) -> None:
        """Insert rows ``first..last`` (inclusive); row i is updated at BASE_TIME + i minutes."""
        self.pg.execute(
            f"INSERT INTO {self.schema}.{TABLE} (id, name, updated_at) "
            "SELECT g, 'event ' || g, %s::timestamptz + g * interval '1 minute' "
            "FROM generate_series(%s::int, %s::int) g",
            (BASE_TIME, first, last),
        )

    def state(self, last_id: int) -> dict[str, Any]:
        """The Singer state tap-postgres ends a sync with when row ``last_id`` is the newest."""
        return {
            "bookmarks": {
                self.stream: {
                    "replication_key": "updated_at",
                    "replication_key_value": bookmark(last_id),
                }
            }
        }

    def tap_command(self, *extra: str) -> str:
        """The tap's command line for ``mapper-state run --tap``."""
        return shlex.join(
            [
                str(self.tap),
                "--config",
                str(self.tap_config),
                "--catalog",
                str(self.catalog),
                *extra,
            ]
        )


def create_table(pg: PostgresServer, schema: str) -> None:
    pg.execute(
        f"CREATE SCHEMA {schema}; "
        f"CREATE TABLE {schema}.{TABLE} "
        "(id integer PRIMARY KEY, name text, updated_at timestamptz NOT NULL)"
    )


def write_tap_config(pg: PostgresServer, schema: str, path: Path) -> Path:
    path.write_text(json.dumps(pg.tap_config(filter_schemas=[schema])))
    os.chmod(path, 0o600)
    return path


def discover_catalog(tap: Path, config: Path) -> dict[str, Any]:
    """``tap-postgres --discover``, with its one stream selected for INCREMENTAL on updated_at."""
    proc = subprocess.run(
        [str(tap), "--config", str(config), "--discover"],
        capture_output=True,
        env=child_env(),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"tap-postgres --discover failed:\n{proc.stderr.decode()[-3000:]}"
    catalog = json.loads(proc.stdout)
    assert len(catalog["streams"]) == 1, f"expected one stream: {catalog}"
    for entry in catalog["streams"][0]["metadata"]:
        if entry["breadcrumb"] == []:
            entry["metadata"].update(
                {
                    "selected": True,
                    "replication-method": "INCREMENTAL",
                    "replication-key": "updated_at",
                }
            )
    return dict(catalog)


@pytest.fixture(scope="session")
def discovered_catalog(
    postgres: PostgresServer,
    real_tools: Tools,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, dict[str, Any]]:
    """The catalog tap-postgres discovers for an ``events`` table, once per session (1.6 s).

    The schema's name is unique: a module that imports this fixture (the chaos suite's
    process kills) holds its own copy of it, discovered in the same cluster.
    """
    schema = "e2e_discovered_" + uuid.uuid4().hex[:8]
    create_table(postgres, schema)
    config = write_tap_config(postgres, schema, tmp_path_factory.mktemp("discover") / "tap.json")
    return schema, discover_catalog(real_tools.tap_postgres, config)


def catalog_for(discovered: tuple[str, dict[str, Any]], schema: str) -> dict[str, Any]:
    """The discovered catalog, pointed at the same table in another schema.

    Discovery names the stream ``<schema>-<table>`` and records the schema in the
    stream's top-level metadata; nothing else in it depends on the schema.
    """
    old_schema, catalog = discovered
    catalog = copy.deepcopy(catalog)
    (stream,) = catalog["streams"]
    assert stream["tap_stream_id"] == stream["stream"] == f"{old_schema}-{TABLE}", stream
    stream["tap_stream_id"] = stream["stream"] = f"{schema}-{TABLE}"
    (top,) = [m["metadata"] for m in stream["metadata"] if m["breadcrumb"] == []]
    assert top["schema-name"] == old_schema, top
    top["schema-name"] = schema
    assert old_schema not in json.dumps(catalog), catalog
    return catalog


@pytest.fixture
def source(
    postgres: PostgresServer,
    real_tools: Tools,
    discovered_catalog: tuple[str, dict[str, Any]],
    tmp_path: Path,
) -> Source:
    """A fresh schema with an empty ``events`` table, and the tap's config and catalog."""
    schema = "e2e_" + uuid.uuid4().hex[:10]
    create_table(postgres, schema)
    config = write_tap_config(postgres, schema, tmp_path / "tap.json")
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps(catalog_for(discovered_catalog, schema)))
    return Source(postgres, schema, config, catalog, real_tools.tap_postgres)


# -- the targets -------------------------------------------------------------------------


@dataclass
class Target:
    """A real target writing into one output directory per run."""

    name: str
    executable: Path
    root: Path

    def command(self, run: str) -> str:
        """The target's command line for the run called ``run`` (its own output directory)."""
        out = self.out_dir(run)
        if self.name == "target-jsonl":
            config = {"destination_path": str(out), "do_timestamp_file": False}
        else:
            config = {"output_path": str(out)}
        path = self.root / f"{run}.{self.name}.json"
        path.write_text(json.dumps(config))
        return shlex.join([str(self.executable), "--config", str(path)])

    def out_dir(self, run: str) -> Path:
        return self.root / f"out-{run}"

    def output_file(self, run: str, stream: str) -> Path:
        suffix = ".jsonl" if self.name == "target-jsonl" else ".csv"
        return self.out_dir(run) / f"{stream}{suffix}"

    def delivered(self, run: str, stream: str) -> list[int]:
        """The ids of the rows the target wrote in that run, in file order."""
        path = self.output_file(run, stream)
        if not path.exists():
            return []
        if self.name == "target-jsonl":
            return [json.loads(line)["id"] for line in path.read_text().splitlines()]
        with path.open(newline="") as f:
            return [int(row["id"]) for row in csv_module.DictReader(f)]


@pytest.fixture
def jsonl(real_tools: Tools, tmp_path: Path) -> Target:
    return Target("target-jsonl", real_tools.target_jsonl, tmp_path)


@pytest.fixture
def csv(real_tools: Tools, tmp_path: Path) -> Target:
    return Target("target-csv", real_tools.target_csv, tmp_path)


@pytest.fixture(params=["target-jsonl", "target-csv"])
def target(request: pytest.FixtureRequest) -> Target:
    """Each real target in turn."""
    chosen: Target = request.getfixturevalue("jsonl" if request.param == "target-jsonl" else "csv")
    return chosen


# -- the store ---------------------------------------------------------------------------


LEASE_FILE = "mapper-state.lease.json"


@dataclass
class Store:
    """Where mapper-state keeps the state, and a way to read it without mapper-state."""

    name: str
    env: dict[str, str]
    read: Any = field(repr=False)  # (key relative to the store's root) -> bytes | None

    def document(self, state_id: str) -> Any:
        """Meltano's part of the stored ``state.json``, read straight from the store.

        A write of mapper-state's also carries a ``mapper_state`` writer record (serial,
        run ID), which Meltano ignores; it is checked here and left out.
        """
        data = self.read(f"{state_id}/state.json")
        if data is None:
            return None
        doc = json.loads(data)
        writer = doc.pop("mapper_state", None)
        assert writer is None or (writer["serial"] >= 1 and writer["run_id"]), writer
        return doc

    def lease(self, state_id: str) -> dict[str, Any] | None:
        """The lease record beside the state, or None when no lease is held.

        On a store not known to enforce delete conditions a released lease stays as a
        record marked released: that is no lease held either.
        """
        data = self.read(f"{state_id}/{LEASE_FILE}")
        try:
            record = None if data is None else json.loads(data)
        except ValueError:  # caught while being replaced
            return None
        if record is not None and record.get("status", "held") != "held":
            return None
        return record


def _local_store(root: Path) -> Store:
    def read(key: str) -> bytes | None:
        try:
            return (root / key).read_bytes()
        except FileNotFoundError:
            return None

    return Store("local", {"MAPPER_STATE_STATE_BACKEND__URI": f"file://{root}"}, read)


#: The ``store`` parameter values of the emulators, and their location fixtures.
EMULATOR_STORES = {
    "s3": "s3_location",
    "rgw": "rgw_location",
    "azure": "azure_location",
    "gcs": "gcs_location",
}


def _emulator_store(name: str, location: StoreLocation) -> Store:
    """A fresh bucket (container) on an emulator, read through the emulator's own SDK."""
    e = location.emulator
    read = object_reader(e.section, location.options, e.endpoint, location.bucket, location.prefix)
    return Store(name, dict(location.env), read)


def _postgres_store(location: PostgresLocation) -> Store:
    """A fresh table in the session's cluster: the very database the tap reads."""

    def read(key: str) -> bytes | None:
        return next((data for k, data, _ in location.rows() if k == key), None)

    return Store("postgres", dict(location.env), read)


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A local store by default; parametrize indirectly with "s3" for a bucket on moto, "rgw"
    on Ceph's RADOS Gateway, "azure" for a container on Azurite, "gcs" for a bucket on
    fake-gcs-server, or "postgres" for a table in the PostgreSQL server the tap reads."""
    kind = getattr(request, "param", "local")
    if kind == "local":
        return _local_store(tmp_path / "store")
    if kind in EMULATOR_STORES:
        return _emulator_store(kind, request.getfixturevalue(EMULATOR_STORES[kind]))
    if kind == "postgres":
        return _postgres_store(request.getfixturevalue("pg_location"))
    raise ValueError(f"unknown store {kind!r}")


# -- running mapper-state ----------------------------------------------------------------


@dataclass
class Mapper:
    """Runs the real ``mapper-state`` with the store's settings, in the test's directory."""

    executable: Path
    store: Store
    cwd: Path

    def env(self, **extra: str) -> dict[str, str]:
        return child_env(**self.store.env, **extra)

    def argv(self, *args: str) -> list[str]:
        return [str(self.executable), *args]

    def __call__(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            cwd=self.cwd,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )

    def spawn_filter(self, state_id: str, stderr: int) -> subprocess.Popen[bytes]:
        """The filter on ``state_id``, fed through its stdin; what it passes on is dropped."""
        return subprocess.Popen(
            self.argv("--state-id", state_id),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=self.env(),
            cwd=self.cwd,
        )

    def run_args(
        self, state_id: str, source: Source, target: Target, run: str, *extra: str
    ) -> tuple[str, ...]:
        return (
            "run",
            "--state-id",
            state_id,
            "--tap",
            source.tap_command(),
            "--target",
            target.command(run),
            *extra,
        )

    def run(
        self, state_id: str, source: Source, target: Target, run: str, *extra: str
    ) -> subprocess.CompletedProcess[str]:
        """``mapper-state run`` to the end, the target writing into its ``run`` directory."""
        return self(*self.run_args(state_id, source, target, run, *extra))

    def spawn(
        self, state_id: str, source: Source, target: Target, run: str, *extra: str
    ) -> subprocess.Popen[str]:
        """``mapper-state run`` in the background (stdout and stderr to files in cwd)."""
        out = open(self.cwd / f"{run}.stdout", "w")  # noqa: SIM115  (the child keeps its copy)
        err = open(self.cwd / f"{run}.stderr", "w")  # noqa: SIM115
        try:
            return subprocess.Popen(
                self.argv(*self.run_args(state_id, source, target, run, *extra)),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                text=True,
                cwd=self.cwd,
                env=self.env(),
            )
        finally:
            out.close()
            err.close()

    def output(self, run: str) -> tuple[str, str]:
        """What a spawned run wrote to its stdout and stderr."""
        return (
            (self.cwd / f"{run}.stdout").read_text(),
            (self.cwd / f"{run}.stderr").read_text(),
        )

    def check(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """A read-only command that checks what the runs left (``state get``, ``lock
        status``), in this process: the runs under test are the real processes."""
        return invoke(*args, cwd=self.cwd, env=self.env())

    def state_get(self, state_id: str) -> Any:
        """``mapper-state state get ID --format json``: the stored Singer state, or None."""
        proc = self.check("state", "get", state_id, "--format", "json")
        if proc.returncode == 10:  # not found
            return None
        assert proc.returncode == 0, f"state get {state_id} failed: {proc.stderr!r}"
        return json.loads(proc.stdout)

    def lock_status(self, state_id: str) -> dict[str, Any]:
        proc = self.check("lock", "status", state_id, "--format", "json")
        assert proc.returncode == 0, f"lock status {state_id} failed: {proc.stderr!r}"
        status: dict[str, Any] = json.loads(proc.stdout)
        return status


@pytest.fixture
def mapper(real_tools: Tools, store: Store, tmp_path: Path) -> Mapper:
    return Mapper(real_tools.mapper_state, store, tmp_path)


@pytest.fixture
def state_id() -> str:
    """A fresh, Meltano-style state ID."""
    return f"dev:tap-postgres-to-target-{uuid.uuid4().hex[:8]}"


# -- processes ---------------------------------------------------------------------------


def children_of(pid: int) -> dict[int, str]:
    """Live child processes of ``pid``: pid -> command line; not the watcher that a lease
    holder starts to outlive it (``mapper_state.warden``), which is no step of the run."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"mapper_state.warden" not in cmdline:
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def is_gone(pid: int) -> bool:
    """The process has exited (gone, or a zombie nobody reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.02) -> float:
    """Poll until ``predicate()`` is true; return the time it became true (monotonic)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}", pytrace=False)
        time.sleep(interval)


def kill_if_running(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
