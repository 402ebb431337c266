"""One stream at a time and the guard, end to end: real tap-postgres with two tables,
target-jsonl, PostgreSQL, through ``mapper-state run`` and the filter in a shell pipeline.

tap-postgres selects ``updated_at >= bookmark``, so an incremental run re-sends each
stream's bookmark row: "only the new rows" below means the new rows plus that one. A
run whose last stream (users) has no new row ends without a final STATE (nothing is
confirmed, see test_run_postgres.py), so every run here adds a user.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import (
    BASE_TIME,
    Mapper,
    Store,
    Target,
    Tools,
    bookmark,
    child_env,
    write_tap_config,
)
from tests.pg import PostgresServer

TABLES = ("events", "users")


@dataclass
class TwoTables:
    """A schema with two tables, both selected INCREMENTAL on ``updated_at``."""

    pg: PostgresServer
    schema: str
    tap_config: Path
    catalog: Path
    tap: Path

    def stream(self, table: str) -> str:
        return f"{self.schema}-{table}"

    def insert(self, table: str, first: int, last: int) -> None:
        self.pg.execute(
            f"INSERT INTO {self.schema}.{table} (id, name, updated_at) "
            "SELECT g, 'row ' || g, %s::timestamptz + g * interval '1 minute' "
            "FROM generate_series(%s::int, %s::int) g",
            (BASE_TIME, first, last),
        )

    def bookmarks(self, **last_ids: int) -> dict[str, Any]:
        """The bookmarks tap-postgres ends a sync with, by table and newest row id."""
        return {
            self.stream(table): {
                "replication_key": "updated_at",
                "replication_key_value": bookmark(last_id),
            }
            for table, last_id in last_ids.items()
        }

    def tap_command(self) -> str:
        return shlex.join(
            [str(self.tap), "--config", str(self.tap_config), "--catalog", str(self.catalog)]
        )


@pytest.fixture
def tables(postgres: PostgresServer, real_tools: Tools, tmp_path: Path) -> TwoTables:
    schema = "e2e_" + uuid.uuid4().hex[:10]
    postgres.execute(
        f"CREATE SCHEMA {schema}; "
        + "".join(
            f"CREATE TABLE {schema}.{t} "
            "(id integer PRIMARY KEY, name text, updated_at timestamptz NOT NULL); "
            for t in TABLES
        )
    )
    config = write_tap_config(postgres, schema, tmp_path / "tap.json")
    proc = subprocess.run(
        [str(real_tools.tap_postgres), "--config", str(config), "--discover"],
        capture_output=True,
        env=child_env(),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    catalog = json.loads(proc.stdout)
    assert sorted(s["tap_stream_id"] for s in catalog["streams"]) == [
        f"{schema}-{t}" for t in TABLES
    ]
    for stream in catalog["streams"]:
        for entry in stream["metadata"]:
            if entry["breadcrumb"] == []:
                entry["metadata"].update(
                    {
                        "selected": True,
                        "replication-method": "INCREMENTAL",
                        "replication-key": "updated_at",
                    }
                )
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(catalog))
    return TwoTables(postgres, schema, config, path, real_tools.tap_postgres)


def run(mapper: Mapper, state_id: str, tables: TwoTables, target: Target, name: str, *extra: str):  # type: ignore[no-untyped-def]
    return mapper(
        "run",
        "--state-id",
        state_id,
        "--tap",
        tables.tap_command(),
        "--target",
        target.command(name),
        *extra,
    )


def delivered(target: Target, run_name: str, tables: TwoTables) -> dict[str, list[int]]:
    return {t: sorted(target.delivered(run_name, tables.stream(t))) for t in TABLES}


@pytest.mark.parametrize("store", ["local", "s3"], indirect=True)
def test_a_full_refresh_of_one_table_keeps_the_other_s_bookmark(
    tables: TwoTables, jsonl: Target, store: Store, mapper: Mapper, state_id: str
) -> None:
    tables.insert("events", 1, 5)
    tables.insert("users", 1, 3)
    first = run(mapper, state_id, tables, jsonl, "first")
    assert first.returncode == 0, first.stderr
    assert delivered(jsonl, "first", tables) == {"events": [1, 2, 3, 4, 5], "users": [1, 2, 3]}
    assert mapper.state_get(state_id)["bookmarks"] == tables.bookmarks(events=5, users=3)

    # one table from the start, the other incrementally
    tables.insert("events", 6, 7)
    tables.insert("users", 4, 4)
    users = tables.stream("users")
    second = run(mapper, state_id, tables, jsonl, "second", "--full-refresh-stream", users)
    assert second.returncode == 0, second.stderr
    assert delivered(jsonl, "second", tables) == {"events": [5, 6, 7], "users": [1, 2, 3, 4]}
    assert mapper.state_get(state_id)["bookmarks"] == tables.bookmarks(events=7, users=4)
    assert "kept" not in second.stderr
    assert "not committing" not in second.stderr

    # the same through the store: clear one stream's bookmark, run as usual
    cleared = mapper("state", "clear", state_id, "--stream", tables.stream("events"))
    assert cleared.returncode == 0, cleared.stderr
    assert list(mapper.state_get(state_id)["bookmarks"]) == [users]
    tables.insert("users", 5, 5)
    third = run(mapper, state_id, tables, jsonl, "third")
    assert third.returncode == 0, third.stderr
    assert delivered(jsonl, "third", tables) == {"events": [1, 2, 3, 4, 5, 6, 7], "users": [4, 5]}
    assert mapper.state_get(state_id)["bookmarks"] == tables.bookmarks(events=7, users=5)
    # read the store without mapper-state: Meltano's document, both bookmarks
    assert store.document(state_id)["completed"]["singer_state"]["bookmarks"] == (
        tables.bookmarks(events=7, users=5)
    )

    # and the diff of that run says which bookmark moved
    diff = json.loads(mapper("state", "diff", state_id, "--format", "json").stdout)
    moved = {d["stream"]: (d["change"], d["changes"]) for d in diff["streams"]}
    assert moved == {
        tables.stream("events"): (
            "added",
            [
                {
                    "path": "",
                    "change": "added",
                    "from": None,
                    "to": tables.bookmarks(events=7)[tables.stream("events")],
                }
            ],
        ),
        users: (
            "changed",
            [
                {
                    "path": "replication_key_value",
                    "change": "changed",
                    "from": bookmark(4),
                    "to": bookmark(5),
                }
            ],
        ),
    }


def test_the_filter_hands_the_tap_the_state_without_the_refreshed_table(
    tables: TwoTables, jsonl: Target, mapper: Mapper, state_id: str, tmp_path: Path
) -> None:
    tables.insert("events", 1, 4)
    tables.insert("users", 1, 2)
    assert run(mapper, state_id, tables, jsonl, "first").returncode == 0
    tables.insert("users", 3, 3)
    fifo = tmp_path / "state.fifo"
    os.mkfifo(fifo)
    out = jsonl.out_dir("filter")
    script = (
        "set -o pipefail; "
        f"{tables.tap_command()} --state {fifo} "
        f"| {mapper.executable} --state-id {state_id} --state-file {fifo} "
        f"--full-refresh-stream {tables.stream('events')} "
        f"| {jsonl.command('filter')}"
    )
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=mapper.env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.exists()
    assert delivered(jsonl, "filter", tables) == {"events": [1, 2, 3, 4], "users": [2, 3]}
    assert mapper.state_get(state_id)["bookmarks"] == tables.bookmarks(events=4, users=3)


@pytest.fixture
def empty_on_drain(real_tools: Tools, tmp_path: Path) -> Path:
    """target-jsonl that prints an empty state when it is done, as some targets do."""
    script = tmp_path / "target-jsonl-empty-on-drain"
    script.write_text(f'#!/bin/sh\n"{real_tools.target_jsonl}" "$@" && echo "{{}}"\n')
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("store", ["local", "s3"], indirect=True)
def test_the_guard_keeps_the_bookmarks_a_target_resets_on_drain(
    tables: TwoTables,
    jsonl: Target,
    store: Store,
    mapper: Mapper,
    state_id: str,
    empty_on_drain: Path,
) -> None:
    bad = Target("target-jsonl", empty_on_drain, jsonl.root)
    tables.insert("events", 1, 3)
    tables.insert("users", 1, 2)
    first = run(mapper, state_id, tables, bad, "first")
    assert first.returncode == 0, first.stderr
    assert "not committing a state without bookmarks" in first.stderr
    assert mapper.state_get(state_id)["bookmarks"] == tables.bookmarks(events=3, users=2)

    # the next run resumes: nothing was reset to the start date
    tables.insert("events", 4, 4)
    tables.insert("users", 3, 3)
    second = run(mapper, state_id, tables, bad, "second")
    assert second.returncode == 0, second.stderr
    assert delivered(bad, "second", tables) == {"events": [3, 4], "users": [2, 3]}
    assert mapper.state_get(state_id)["bookmarks"] == tables.bookmarks(events=4, users=3)

    # asked for, the reset goes through
    reset = run(mapper, state_id, tables, bad, "reset", "--set", "allow_state_reset=true")
    assert reset.returncode == 0, reset.stderr
    assert mapper.state_get(state_id) == {}
