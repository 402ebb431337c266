"""`state diff`: which bookmark moved from what to what, through the real command on the
local store and on S3 (moto)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ON_BOTH
from tests.helpers import StoreCli, refreshing, state_line
from tests.support.states import sdk_bookmarks

BEFORE = {
    "bookmarks": {**sdk_bookmarks("2024-01-01", [10, 20]), "gone": {"id": 1}, "same": {"id": 2}},
    "currently_syncing": "users",
}
AFTER = {
    "bookmarks": {**sdk_bookmarks("2024-02-01", [15, 20]), "added": {"id": 3}, "same": {"id": 2}},
    "currently_syncing": None,
}


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_diff_of_the_last_run_per_stream(store_cli: StoreCli) -> None:
    cli = store_cli
    cli.set("job", BEFORE)
    # a pipeline run moves the bookmarks (the filter commits, then keeps its snapshot)
    run = cli("--state-id", "job", *refreshing("gone"), input=state_line(AFTER))
    assert run.returncode == 0, run.stderr

    text = cli("state", "diff", "job")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.decode().splitlines()
    assert lines[0].startswith("job: ")
    assert "state set" not in lines[0]
    assert lines[1:] == [
        '  added: added {"id":3}',
        '  gone: removed (was {"id":1})',
        '  orders.partitions[{"shop":1}].replication_key_value: 10 -> 15',
        '  users.replication_key_value: "2024-01-01" -> "2024-02-01"',
        '  currently_syncing: "users" -> null',
        "  1 stream unchanged",
    ]

    doc = json.loads(cli("state", "diff", "job", "--format", "json").stdout)
    history = json.loads(cli("state", "history", "job", "--format", "json").stdout)
    assert doc["from"]["snapshot"] == history[1]["snapshot"]
    assert doc["to"]["snapshot"] == history[0]["snapshot"]
    assert doc["to"]["run_id"] == history[0]["run_id"]
    users = next(s for s in doc["streams"] if s["stream"] == "users")
    assert users == {
        "stream": "users",
        "change": "changed",
        "changes": [
            {
                "path": "replication_key_value",
                "change": "changed",
                "from": "2024-01-01",
                "to": "2024-02-01",
            }
        ],
    }
    assert [s["stream"] for s in doc["streams"]] == ["added", "gone", "orders", "users"]
    assert doc["unchanged"] == ["same"]


def test_diff_between_named_snapshots_and_the_current_state(store_cli: StoreCli) -> None:
    cli = store_cli
    cli.set("job", BEFORE)
    cli.set("job", AFTER)
    names = [
        h["snapshot"] for h in json.loads(cli("state", "history", "job", "--format", "json").stdout)
    ]
    newest, oldest = names[0], names[-1]

    back = json.loads(cli("state", "diff", "job", newest, oldest, "--format", "json").stdout)
    users = next(s for s in back["streams"] if s["stream"] == "users")
    assert users["changes"][0]["from"] == "2024-02-01"
    assert users["changes"][0]["to"] == "2024-01-01"

    since = cli("state", "diff", "job", oldest[:-4])  # a unique start of its name
    assert since.returncode == 0, since.stderr
    assert since.stdout.decode().splitlines()[0].endswith("-> current")

    nothing = cli("state", "diff", "job", "current", newest)
    assert nothing.returncode == 0
    assert "no bookmark moved" in nothing.stdout.decode()


def test_diff_errors(store_cli: StoreCli) -> None:
    cli = store_cli
    assert cli("state", "diff", "nope").returncode == 10
    cli.set("job", BEFORE)
    first = cli("state", "diff", "job")  # one snapshot: everything was added
    assert first.returncode == 0
    assert "(nothing) ->" in first.stdout.decode()
    assert "users: added" in first.stdout.decode()
    unknown = cli("state", "diff", "job", "19990101")
    assert unknown.returncode == 10
    assert b"no snapshot 19990101" in unknown.stderr
    assert cli("state", "diff", "job", "a", "b", "c").returncode == 6
