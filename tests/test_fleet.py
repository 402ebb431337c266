"""The fleet view, `state list --long` and `state list --stale`, through the real command on
the local store and on S3 (moto)."""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import datetime
from pathlib import Path

import pytest

from mapper_state.core.lease import Lease
from mapper_state.errors import ConfigError
from mapper_state.ops import fleet
from tests.conftest import ON_BOTH
from tests.helpers import StoreCli, state_line

MELTANO_DOC = {"completed": {"singer_state": {"bookmarks": {"s": {"id": 1}}}}, "partial": {}}


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_list_long_shows_writer_age_lease_and_snapshots(store_cli: StoreCli) -> None:
    cli = store_cli
    store = cli.open_store()
    run = cli("--state-id", "dev:a", input=state_line({"bookmarks": {"s": {"id": 5}}}))
    assert run.returncode == 0, run.stderr
    cli.set("dev:a", {"bookmarks": {"s": {"id": 6}}})  # an operator write after the run
    history = json.loads(cli("state", "history", "dev:a", "--format", "json").stdout)
    store.create("dev:meltano/state.json", json.dumps(MELTANO_DOC).encode())  # no history
    holder = Lease(store, "dev:meltano", ttl=60, run_id="nightly-42")
    holder.acquire()
    try:
        started = time.time()
        result = cli("state", "list", "--long", "--format", "json")
        text = cli("state", "list", "--long")
    finally:
        holder.release()
    assert result.returncode == 0, result.stderr
    rows = {row["state_id"]: row for row in json.loads(result.stdout)}
    assert list(rows) == ["dev:a", "dev:meltano"]

    a = rows["dev:a"]
    assert a["writer_run_id"] == history[0]["run_id"]  # the operator write's run
    assert a["snapshots"] == 2
    assert a["lease"] == {"status": "free"}
    assert 0 <= a["age_seconds"] < 120
    written = datetime.fromisoformat(a["last_written"].replace("Z", "+00:00")).timestamp()
    assert abs(written - started) < 120

    m = rows["dev:meltano"]
    assert m["writer_run_id"] is None
    assert m["snapshots"] == 0  # written by another tool
    assert m["last_written"] is not None  # the store's own modification time
    lease = m["lease"]
    assert lease["status"] == "held"
    assert lease["run_id"] == "nightly-42"
    assert lease["host"] == socket.gethostname()
    assert lease["pid"] == os.getpid()
    assert lease["expires_at"].endswith("Z")

    lines = text.stdout.decode().splitlines()
    assert lines[0].split() == [
        "STATE",
        "ID",
        "LAST",
        "WRITTEN",
        "(UTC)",
        "AGE",
        "WRITER",
        "SNAPSHOTS",
        "LAST",
        "RUN",
        "LEASE",
    ]
    assert lines[1].startswith("dev:a ")
    assert history[0]["run_id"] in lines[1]
    assert lines[2].startswith("dev:meltano ")
    assert "nightly-42 on " in lines[2]
    assert " - " in lines[2]
    assert "expires " in lines[2]


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_stale_exits_non_zero_when_a_state_has_not_moved(store_cli: StoreCli) -> None:
    cli = store_cli
    cli.set("prod:a", {"bookmarks": {"s": 1}})
    fresh = cli("state", "list", "--stale", "1h")
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout == b""
    assert b"every one of 1 state moved within 1h" in fresh.stderr
    time.sleep(1.1)
    old = cli("state", "list", "--stale", "1s", "--format", "json")
    assert old.returncode == 12, old.stderr
    assert [r["state_id"] for r in json.loads(old.stdout)] == ["prod:a"]
    assert b"1 of 1 state" in old.stderr
    assert b"have not moved for 1s" in old.stderr
    bad = cli("state", "list", "--stale", "soon")
    assert bad.returncode == 2
    assert b"not a duration" in bad.stderr


def test_stale_picks_the_pipelines_that_stopped(store_cli: StoreCli, tmp_path: Path) -> None:
    cli = store_cli
    for state_id in ("prod:moving", "prod:stuck", "dev:stuck"):
        cli.set(state_id, {"bookmarks": {"s": 1}})
    two_days_ago = time.time() - 2 * 86400
    for state_id in ("prod:stuck", "dev:stuck"):
        os.utime(tmp_path / "store" / state_id / "state.json", (two_days_ago, two_days_ago))
    result = cli("state", "list", "--stale", "36h", "--pattern", "prod:*")
    assert result.returncode == 12, result.stderr
    lines = result.stdout.decode().splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["prod:stuck"]
    assert "2.0d ago" in lines[1] or "48.0h ago" in lines[1]


def test_durations() -> None:
    assert fleet.parse_duration("90") == 90
    assert fleet.parse_duration("15m") == 900
    assert fleet.parse_duration("1h30m") == 5400
    assert fleet.parse_duration("2d") == 172800
    assert fleet.parse_duration("1w") == 604800
    for bad in ("", "h", "3x", "1h-2m"):
        with pytest.raises(ConfigError, match="not a duration"):
            fleet.parse_duration(bad)


@pytest.mark.cloud
def test_the_fleet_view_costs_three_listings_and_a_read_per_state(s3_location) -> None:  # type: ignore[no-untyped-def]
    from mapper_state.core import history, state

    store = s3_location.open()
    for n in range(4):
        state.save(store, f"id-{n}", {"bookmarks": {"s": n}}, None)
        for run in range(5):
            history.write_snapshot(
                store,
                f"id-{n}",
                {"bookmarks": {"s": n}},
                run_id=f"r{run}",
                keep=20,
                host="",
                command="",
            )
    calls: list[str] = []
    s3 = store.store  # the S3 store the registry's guard hands out: count its requests
    for name in ("_list_page", "read"):
        original = getattr(s3, name)

        def counted(*args: object, _original=original, _name=name) -> object:  # type: ignore[no-untyped-def]
            calls.append(_name)
            return _original(*args)

        setattr(s3, name, counted)
    pipelines = fleet.details(store, fleet.survey(store))
    assert [p.snapshots for p in pipelines] == [5, 5, 5, 5]
    assert all(p.writer_run_id == "r4" for p in pipelines)
    # one listing of the states, one of the history, one of the run records; then the
    # state and newest snapshot each (no run record here: none to read)
    assert calls.count("_list_page") == 3
    assert calls.count("read") == 8
