"""The real tap-postgres -> target-jsonl pipeline keeping its state in the PostgreSQL it reads.

One server, one database: the ``events`` table the tap extracts from and mapper-state's
table of states and leases sit side by side, under ``mapper-state run`` and under the
real Meltano 4.4.1 (mapper-state as a mapping). tap-postgres selects ``updated_at >=``
the bookmark, so each later run re-sends the bookmark row: "the new rows" below are the
new rows plus that one.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import tools
from tests.e2e.conftest import Mapper, Source, Store, Target, kill_if_running
from tests.helpers import state_line, wait_until
from tests.pg import PostgresLocation
from tests.support import meltano_fork


def _keys(location: PostgresLocation) -> list[str]:
    return [key for key, _, _ in location.rows()]


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_run_keeps_the_state_in_the_server_it_extracts_from(
    source: Source,
    jsonl: Target,
    store: Store,
    mapper: Mapper,
    state_id: str,
    pg_location: PostgresLocation,
) -> None:
    assert pg_location.server is source.pg  # the same server, the same database
    source.insert(1, 5)
    first = mapper.run(state_id, source, jsonl, "first")
    assert first.returncode == 0, first.stderr
    assert sorted(jsonl.delivered("first", source.stream)) == [1, 2, 3, 4, 5]
    assert mapper.state_get(state_id) == source.state(5)

    source.insert(6, 8)
    second = mapper.run(state_id, source, jsonl, "second")
    assert second.returncode == 0, second.stderr
    assert sorted(jsonl.delivered("second", source.stream)) == [5, 6, 7, 8]
    # read straight from the table: Meltano's document layout, the new bookmark
    assert store.document(state_id) == {
        "completed": {"singer_state": source.state(8)},
        "partial": {},
    }
    keys = _keys(pg_location)
    assert f"{state_id}/state.json" in keys
    assert f"{state_id}/mapper-state.lease.json" not in keys  # released
    assert sum(1 for k in keys if "/history/" in k or k.startswith(".mapper-state")) >= 2
    assert mapper.lock_status(state_id)["free"] is True
    assert source.pg.password not in first.stderr + second.stderr


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_a_second_run_fails_at_once_while_the_lease_is_held_in_postgres(
    source: Source, jsonl: Target, store: Store, mapper: Mapper, state_id: str
) -> None:
    source.insert(1, 3)
    holder = mapper.spawn_filter(state_id, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: store.lease(state_id) is not None, "the holder's lease", timeout=30)
        started = time.monotonic()
        busy = mapper.run(state_id, source, jsonl, "busy")
        assert busy.returncode == 3, busy.stderr
        assert time.monotonic() - started < 10
        assert f"(pid {holder.pid})" in busy.stderr
        assert not jsonl.out_dir("busy").exists()  # the tap never started
        holder.communicate(state_line(source.state(2)), timeout=60)
        assert holder.returncode == 0
    finally:
        kill_if_running(holder)
    after = mapper.run(state_id, source, jsonl, "after")
    assert after.returncode == 0, after.stderr
    assert sorted(jsonl.delivered("after", source.stream)) == [2, 3]


# -- under Meltano -----------------------------------------------------------------------


def _meltano_project(root: Path, source: Source, location: PostgresLocation) -> dict[str, str]:
    """A Meltano project: tap-postgres -> mapper-state (state in ``location``) -> target-jsonl.

    Meltano keeps its own copy of the state in a file backend of the project; mapper-state
    commits the same state ID into PostgreSQL and holds the lease there. The passwords come
    from the environment, never from meltano.yml.
    """
    stream = source.stream
    doc = tools.meltano_project(
        root,
        {
            "extractors": [
                {
                    "name": "tap-postgres",
                    "namespace": "tap_postgres",
                    "executable": str(tools.tap_postgres()),
                    "capabilities": ["catalog", "discover", "state", "about"],
                    "settings": [
                        {"name": "host"},
                        {"name": "port", "kind": "integer"},
                        {"name": "user"},
                        {"name": "password", "sensitive": True},
                        {"name": "database"},
                        {"name": "filter_schemas", "kind": "array"},
                    ],
                    "config": {
                        "host": source.pg.host,
                        "port": source.pg.port,
                        "user": source.pg.user,
                        "database": source.pg.dbname,
                        "filter_schemas": [source.schema],
                    },
                    "select": [f"{stream}.*"],
                    "metadata": {
                        stream: {
                            "replication-method": "INCREMENTAL",
                            "replication-key": "updated_at",
                        }
                    },
                }
            ],
            "loaders": [
                {
                    "name": "target-jsonl",
                    "namespace": "target_jsonl",
                    "executable": str(tools.target_jsonl()),
                    "settings": [
                        {"name": "destination_path"},
                        {"name": "do_timestamp_file", "kind": "boolean"},
                    ],
                    "config": {
                        "destination_path": str(root / "output"),
                        "do_timestamp_file": False,
                    },
                }
            ],
            "mappers": [
                {
                    "name": "mapper-state",
                    "namespace": "mapper_state",
                    "executable": str(tools.mapper_state()),
                    "settings": [
                        {"name": "state_id"},
                        {"name": "state_backend.uri"},
                        {"name": "state_backend.postgres.password", "sensitive": True},
                    ],
                    "mappings": [
                        {
                            "name": "remote-state",
                            "config": {
                                "state_id": "${MELTANO_ENVIRONMENT}:tap-postgres-to-target-jsonl",
                                "state_backend.uri": location.uri,
                            },
                        }
                    ],
                }
            ],
        },
    )
    root.mkdir(parents=True)
    (root / "meltano.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tools.tool_env(
        MELTANO_SEND_ANONYMOUS_USAGE_STATS="false",
        MELTANO_CLI_DISABLE_VERSION_CHECK="true",
        TAP_POSTGRES_PASSWORD=source.pg.password,
        MAPPER_STATE_STATE_BACKEND__POSTGRES__PASSWORD=location.server.password,
    )


def _meltano(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return meltano_fork.run(tools.meltano(), args, cwd=root, env=env, timeout=180)


def _delivered(root: Path, stream: str) -> list[int]:
    path = root / "output" / f"{stream}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]


def test_meltano_runs_keep_the_state_and_the_lease_in_the_server_they_extract_from(
    source: Source, pg_location: PostgresLocation, tmp_path: Path, real_tools: Any
) -> None:
    root = tmp_path / "project"
    env = _meltano_project(root, source, pg_location)
    state_id = "dev:tap-postgres-to-target-jsonl"
    ours = Mapper(real_tools.mapper_state, Store("postgres", pg_location.env, None), tmp_path)
    pipeline = ("run", "tap-postgres", "remote-state", "target-jsonl")

    source.insert(1, 5)
    first = _meltano(root, env, *pipeline)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _delivered(root, source.stream) == [1, 2, 3, 4, 5]
    assert "lock_only" not in first.stderr  # its store is not Meltano's: it commits there
    wait_until(lambda: ours.lock_status(state_id)["free"], "the keeper to release", timeout=30)
    assert ours.state_get(state_id) == source.state(5)

    source.insert(6, 8)
    second = _meltano(root, env, *pipeline)
    assert second.returncode == 0, second.stderr[-3000:]
    assert _delivered(root, source.stream) == [1, 2, 3, 4, 5, 5, 6, 7, 8]
    wait_until(lambda: ours.lock_status(state_id)["free"], "the keeper to release", timeout=30)
    assert ours.state_get(state_id) == source.state(8)
    got = _meltano(root, env, "--log-level=warning", "state", "get", state_id)
    assert json.loads(got.stdout) == {"singer_state": source.state(8)}, got.stderr
    for output in (first.stdout, first.stderr, second.stdout, second.stderr):
        assert source.pg.password not in output

    # while another run holds the lease in PostgreSQL, a Meltano run fails at once
    holder = ours.spawn_filter(state_id, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: not ours.lock_status(state_id)["free"], "the holder", timeout=30)
        source.insert(9, 9)
        busy = _meltano(root, env, *pipeline)
        assert busy.returncode != 0
        assert f"state ID {state_id} is busy: held by run" in busy.stderr
        assert _delivered(root, source.stream) == [1, 2, 3, 4, 5, 5, 6, 7, 8]
        holder.communicate(b"", timeout=60)
        assert holder.returncode == 0
    finally:
        kill_if_running(holder)
