"""One stream at a time: `state get|set|clear --stream` and `--full-refresh-stream`,
through the real command on the local store and on S3 (moto)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ON_BOTH
from tests.helpers import StoreCli, refreshing, state_line, tiny_run
from tests.support.states import sdk_bookmarks

# singer-sdk's shapes: a plain bookmark, one with partitions, one still in progress
SDK_STATE: dict[str, Any] = {
    "bookmarks": {
        **sdk_bookmarks("2024-05-01", [10, 20]),
        "events": {"progress_markers": {"Note": "sync in progress", "replication_key_value": 7}},
    },
    "currently_syncing": "events",
}
# a classic tap's flat bookmarks
CLASSIC_STATE = {"bookmarks": {"public-users": {"xmin": 77, "version": 1}, "public-x": "2024"}}


@pytest.fixture
def cli(store_cli: StoreCli) -> StoreCli:
    """The command on the store under test: the local one, and S3 where a test says ON_BOTH."""
    return store_cli


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_get_set_and_clear_one_stream(cli: StoreCli) -> None:
    cli.set("job", SDK_STATE)

    got = cli("state", "get", "job", "--stream", "orders", "--format", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == SDK_STATE["bookmarks"]["orders"]

    new = {"replication_key": "updated_at", "replication_key_value": "2024-06-01"}
    done = cli("state", "set", "job", "--stream", "users", json.dumps(new))
    assert done.returncode == 0, done.stderr
    assert cli.get("job")["bookmarks"] == {**SDK_STATE["bookmarks"], "users": new}

    cleared = cli("state", "clear", "job", "--stream", "events", "--stream", "orders")
    assert cleared.returncode == 0, cleared.stderr
    assert b"cleared the bookmark of events, orders in job" in cleared.stderr
    # the other stream survives; currently_syncing no longer resumes a cleared stream
    assert cli.get("job") == {"bookmarks": {"users": new}, "currently_syncing": None}

    # every change is a history snapshot: the rollback the message names undoes it
    undo = cleared.stderr.decode().split("`")[1].split()
    assert undo[:3] == ["mapper-state", "state", "rollback"]
    assert cli(*undo[1:]).returncode == 0
    assert cli.get("job")["bookmarks"] == {**SDK_STATE["bookmarks"], "users": new}


def test_classic_flat_bookmarks_and_a_new_stream(cli: StoreCli) -> None:
    cli.set("job", CLASSIC_STATE)
    assert cli.get("job", "--stream", "public-x") == "2024"
    assert cli("state", "set", "job", "--stream", "public-new", '{"xmin": 1}').returncode == 0
    assert cli.get("job")["bookmarks"]["public-new"] == {"xmin": 1}
    assert cli("state", "clear", "job", "--stream", "public-users").returncode == 0
    assert cli.get("job") == {"bookmarks": {"public-x": "2024", "public-new": {"xmin": 1}}}
    # a stream's bookmark on stdin, into a state ID that has none yet
    created = cli("state", "set", "other", "--stream", "s", "-", input=b'{"id": 5}')
    assert created.returncode == 0, created.stderr
    assert cli.get("other") == {"bookmarks": {"s": {"id": 5}}}


def test_unknown_streams_change_nothing(cli: StoreCli) -> None:
    cli.set("job", CLASSIC_STATE)
    for args in (
        ("get", "job", "--stream", "nope"),
        ("clear", "job", "--stream", "public-x", "--stream", "nope"),
    ):
        result = cli("state", *args)
        assert result.returncode == 10, result.stderr
        err = result.stderr.decode()
        assert (
            "has no bookmark for stream nope (it has bookmarks for public-users, public-x)" in err
        )
    assert cli.get("job") == CLASSIC_STATE
    missing = cli("state", "clear", "missing", "--stream", "s")
    assert missing.returncode == 10
    assert b"missing not found" in missing.stderr
    bad = cli("state", "set", "job", "--stream", "s", "not json")
    assert bad.returncode == 6
    assert b"nothing was changed" in bad.stderr
    null = cli("state", "set", "job", "--stream", "s", "null")
    assert null.returncode == 6
    assert b"state clear job --stream s" in null.stderr
    assert cli("state", "clear", "--all", "--stream", "s").returncode == 2
    assert cli.get("job") == CLASSIC_STATE


# -- a full refresh of one stream -------------------------------------------------------


def test_filter_hands_the_tap_the_state_without_the_refreshed_streams(
    cli: StoreCli, tmp_path: Path
) -> None:
    cli.set("job", SDK_STATE)
    handed = tmp_path / "handed.json"
    # the tap extracts orders from the start and carries the others forward
    after = {"bookmarks": {**SDK_STATE["bookmarks"], "orders": {"replication_key_value": 3}}}
    refresh = refreshing("orders", "events")
    result = cli(
        "--state-id", "job", "--state-file", str(handed), *refresh, input=state_line(after)
    )
    assert result.returncode == 0, result.stderr
    bookmarks = dict(SDK_STATE["bookmarks"])
    del bookmarks["orders"], bookmarks["events"]
    assert json.loads(handed.read_text()) == {"bookmarks": bookmarks, "currently_syncing": None}
    assert cli.get("job") == after


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_run_extracts_only_the_refreshed_stream_and_keeps_the_rest(
    cli: StoreCli, tmp_path: Path
) -> None:
    cli.set("job", {"bookmarks": {"s": 5, "other": {"replication_key_value": "x"}}})
    report = tmp_path / "tap.json"
    result = cli(*tiny_run(tmp_path, *refreshing("s")), TINY_TAP_REPORT=str(report))
    assert result.returncode == 0, result.stderr
    # the tap got the state without s: it started s from the beginning
    assert json.loads(report.read_text())["state"] == {
        "bookmarks": {"other": {"replication_key_value": "x"}}
    }
    out = (tmp_path / "out.jsonl").read_text().splitlines()
    assert [json.loads(line)["i"] for line in out] == [1, 2, 3]
    # the tiny tap's states name s only: the guard kept the other stream's bookmark
    assert cli.get("job") == {"bookmarks": {"s": 3, "other": {"replication_key_value": "x"}}}
    assert b"has no bookmark for other, which the stored state has: kept it" in result.stderr
