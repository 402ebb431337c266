"""Per-run snapshots: `history.record`, `state history` and `state rollback`."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from mapper_state.core import history, state
from mapper_state.ops import commands as ops
from mapper_state.ops.summary import summarize_change
from mapper_state.stores.base import StoreAccessDenied, StoreError
from mapper_state.stores.file import FileStore
from mapper_state.stores.memory import MemoryStore
from tests.conftest import ON_BOTH
from tests.contract.paging import CloudPaging
from tests.helpers import StoreCli, state_line
from tests.servers import StoreLocation
from tests.support.cli import invoke_filter
from tests.support.cli import invoke_on_store as mapper

TERMS = ops.WriteTerms(ttl=30, retry=1, wait=0, history_keep=20)


def bookmarks(**streams: int) -> dict[str, Any]:
    return {"bookmarks": {name: {"replication_key_value": v} for name, v in streams.items()}}


# -- record --------------------------------------------------------------------------


def test_record_keeps_the_newest_snapshots_outside_the_state_folder() -> None:
    store = MemoryStore()
    for n in range(5):
        history.record(store, "dev:tap-to-target", bookmarks(users=n), run_id=f"run-{n}", keep=3)
    snaps = history.list_snapshots(store, "dev:tap-to-target")
    assert [s.run_id for s in snaps] == ["run-2", "run-3", "run-4"]
    assert [s.value for s in snaps] == [bookmarks(users=n) for n in (2, 3, 4)]
    assert all(s.host == socket.gethostname() and s.note == "" for s in snaps)
    keys = sorted(store.list())
    assert keys == sorted(f".mapper-state/history/dev:tap-to-target/{s.name}.json" for s in snaps)
    assert [k.split("/")[-1][:23] for k in keys] == sorted(
        s.time.strftime("%Y%m%dT%H%M%S.%fZ") for s in snaps
    )
    assert not any(k.endswith("state.json") for k in keys)  # Meltano never sees them as states
    assert ops.list_state_ids(store) == []


def test_record_with_keep_zero_keeps_nothing() -> None:
    store = MemoryStore()
    history.record(store, "job", {"a": 1}, run_id="r", keep=0)
    assert list(store.list()) == []


def test_names_sort_by_time_even_when_the_clock_goes_back() -> None:
    store = MemoryStore()
    future = "29991231T235959.999990Z-other-host"
    store.create(
        f".mapper-state/history/job/{future}.json", orjson.dumps({"singer_state": {"a": 1}})
    )
    history.record(store, "job", {"a": 2}, run_id="late", keep=5)
    names = history.snapshot_names(store, "job")
    assert names[0] == future
    assert names[1].endswith("-late")
    assert names[1] > future
    assert [s.value for s in history.list_snapshots(store, "job")] == [{"a": 1}, {"a": 2}]


def test_run_ids_are_made_safe_for_keys() -> None:
    store = MemoryStore()
    history.record(store, "job", {}, run_id="../../etc/passwd x", keep=5)
    [key] = store.list()
    assert key.startswith(".mapper-state/history/job/")
    assert key.count("/") == 3
    assert key.endswith("-_.._etc_passwd_x.json")


def test_a_nested_state_id_named_history_is_not_history() -> None:
    store = MemoryStore()
    ops.set_state(store, "job/history", {"own": 1}, TERMS)
    ops.set_state(store, "job", {"a": 1}, TERMS)
    assert [s.value for s in history.list_snapshots(store, "job")] == [{"a": 1}]
    assert ops.list_state_ids(store) == ["job", "job/history"]


def test_summary_names_the_bookmarks_that_changed() -> None:
    old = {**bookmarks(users=1, orders=1, gone=1), "currently_syncing": None}
    new = {**bookmarks(users=2, orders=1, added=1), "currently_syncing": "users"}
    assert summarize_change(old, new) == (
        "changed bookmarks.users, currently_syncing; added bookmarks.added; removed bookmarks.gone"
    )
    assert summarize_change(None, new) == "first snapshot"
    assert summarize_change(new, new) == "no change"
    many = summarize_change(bookmarks(), bookmarks(a=1, b=1, c=1, d=1, e=1, f=1))
    assert many == "added bookmarks.a, bookmarks.b, bookmarks.c, bookmarks.d (+2 more)"


# -- through the command line --------------------------------------------------------


def test_history_lists_runs_with_what_changed(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    ops.set_state(store, "job", bookmarks(users=1, orders=1), TERMS)
    # a pipeline run: its final commit, then its snapshot
    state.save(store, "job", bookmarks(users=2, orders=1), state.load(store, "job").version)
    history.record(store, "job", bookmarks(users=2, orders=1), run_id="nightly-1", keep=20)
    ops.merge_state(store, "job", bookmarks(orders=5), TERMS)

    text = mapper(tmp_path, "state", "history", "job")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.decode().splitlines()
    assert lines[0] == "job: 3 snapshots, newest first; * marks the current state"
    assert lines[1].split() == ["SNAPSHOT", "TIME", "(UTC)", "RUN", "HOST", "BY", "CHANGES"]
    newest, run, first = lines[2:]
    assert newest.startswith("*")
    assert newest.endswith("state merge  changed bookmarks.orders")
    assert "nightly-1" in run
    assert f" {socket.gethostname()} " in run
    assert run.endswith("run          changed bookmarks.users")
    assert first.endswith("state set    first snapshot")

    doc = json.loads(mapper(tmp_path, "state", "history", "job", "--format", "json").stdout)
    assert [d["run_id"] for d in doc][1] == "nightly-1"
    assert [d["current"] for d in doc] == [True, False, False]
    assert doc[1]["singer_state"] == bookmarks(users=2, orders=1)
    assert doc[0]["changes"] == "changed bookmarks.orders"


def test_rollback_restores_a_snapshot_and_is_itself_recorded(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    ops.set_state(store, "job", bookmarks(users=1), TERMS)
    good = history.snapshot_names(store, "job")[-1]
    ops.set_state(store, "job", bookmarks(users=999), TERMS)  # a bad run

    result = mapper(tmp_path, "state", "rollback", "job", "--to", good[:-4])  # a unique prefix
    assert result.returncode == 0, result.stderr
    assert f"rolled job back to snapshot {good}".encode() in result.stderr
    assert json.loads(mapper(tmp_path, "state", "get", "job").stdout) == bookmarks(users=1)
    snaps = history.list_snapshots(store, "job")
    assert len(snaps) == 3
    assert snaps[-1].note == f"state rollback to {good}"
    assert snaps[-1].value == bookmarks(users=1)

    again = mapper(tmp_path, "state", "rollback", "job", "--to", good)
    assert again.returncode == 0
    assert b"already at snapshot" in again.stderr
    assert len(history.snapshot_names(store, "job")) == 3


def test_rollback_errors(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    ops.set_state(store, "job", {"a": 1}, TERMS)
    ops.set_state(store, "job", {"a": 2}, TERMS)
    before = (tmp_path / "job" / "state.json").read_bytes()
    unknown = mapper(tmp_path, "state", "rollback", "job", "--to", "19990101")
    assert unknown.returncode == 10
    assert b"no snapshot 19990101" in unknown.stderr
    ambiguous = mapper(tmp_path, "state", "rollback", "job", "--to", "2")
    assert ambiguous.returncode == 6
    assert b"ambiguous" in ambiguous.stderr
    none = mapper(tmp_path, "state", "rollback", "other", "--to", "2")
    assert none.returncode == 10
    assert b"no history" in none.stderr
    assert (tmp_path / "job" / "state.json").read_bytes() == before


def test_a_state_written_without_history_is_kept_before_it_is_changed(tmp_path: Path) -> None:
    # e.g. written by Meltano, or by a lock_only run: no snapshot holds it yet
    (tmp_path / "job").mkdir()
    doc = {"completed": {"singer_state": bookmarks(users=1)}, "partial": {}}
    (tmp_path / "job" / "state.json").write_text(json.dumps(doc))
    assert mapper(tmp_path, "state", "set", "job", json.dumps(bookmarks(users=2))).returncode == 0
    text = mapper(tmp_path, "state", "history", "job").stdout.decode()
    assert "unrecorded" in text
    assert "another writer" in text
    oldest = history.snapshot_names(FileStore(tmp_path), "job")[0]
    assert mapper(tmp_path, "state", "rollback", "job", "--to", oldest).returncode == 0
    assert json.loads(mapper(tmp_path, "state", "get", "job").stdout) == bookmarks(users=1)


def test_history_keep_setting(tmp_path: Path) -> None:
    for n in range(4):
        result = mapper(
            tmp_path, "state", "set", "job", json.dumps({"n": n}), "--set", "history_keep=2"
        )
        assert result.returncode == 0, result.stderr
    snaps = history.list_snapshots(FileStore(tmp_path), "job")
    assert [s.value for s in snaps] == [{"n": 2}, {"n": 3}]


class HistoryRefused(MemoryStore):
    """A store whose credentials may write states but not history snapshots."""

    def create(self, key: str, data: bytes) -> str:
        if "/history/" in key:
            raise StoreAccessDenied(f"403 on {key}")
        return super().create(key, data)


def test_a_change_that_could_not_be_undone_is_not_made(capsys: pytest.CaptureFixture[str]) -> None:
    store = HistoryRefused()
    state.save(store, "job", {"a": 1}, None)  # no snapshot holds it yet
    with pytest.raises(StoreError, match="nothing was changed"):
        ops.set_state(store, "job", {"a": 2}, TERMS)
    assert state.load(store, "job").value == {"a": 1}

    ops.set_state(store, "new", {"b": 1}, TERMS)  # nothing to lose: written, with a warning
    assert state.load(store, "new").value == {"b": 1}
    assert "was written, but not its history snapshot" in capsys.readouterr().err


def test_a_run_whose_snapshot_fails_keeps_its_state_with_a_warning(tmp_path: Path) -> None:
    """The commit path's rule holds for a run too: its state is written and stays."""
    root = tmp_path / ".mapper-state"  # the filter's default store
    (root / history.HISTORY_ROOT).parent.mkdir(parents=True)
    (root / history.HISTORY_ROOT).write_text("")  # a file where the snapshots' folder would be
    line = state_line(bookmarks(users=1))
    result = invoke_filter("--state-id", "job", cwd=tmp_path, input=line)
    assert result.returncode == 0, result.stderr
    assert result.stdout == line
    assert b"the state of job was written, but not its history snapshot" in result.stderr
    assert state.load(FileStore(root), "job").value == bookmarks(users=1)


# -- where the history lives ---------------------------------------------------------


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_history_survives_the_state_folder_being_deleted(store_cli: StoreCli) -> None:
    """`meltano state clear ID` on the local store deletes `<ID>/` whole: the history is
    elsewhere (on S3, every object under `<ID>/` is deleted here, more than Meltano does)."""
    cli = store_cli
    cli.set("dev:tap-to-target", bookmarks(users=1))
    cli.set("dev:tap-to-target", bookmarks(users=2))
    store = cli.open_store()
    good = history.snapshot_names(store, "dev:tap-to-target")[-1]
    if cli.name == "local":
        shutil.rmtree(Path(store.root) / "dev:tap-to-target")  # what Meltano's backend does
    else:
        for key in list(store.list("dev:tap-to-target/")):
            store.delete(key)
    assert cli.get("dev:tap-to-target") is None

    listed = cli("state", "history", "dev:tap-to-target")
    assert listed.returncode == 0, listed.stderr
    assert "2 snapshots" in listed.stdout.decode()
    assert "it has no state now" in listed.stdout.decode()
    assert cli("state", "list").stdout == b""  # the history is not a state
    back = cli("state", "rollback", "dev:tap-to-target", "--to", good)
    assert back.returncode == 0, back.stderr
    assert cli.get("dev:tap-to-target") == bookmarks(users=2)


def test_history_in_the_old_place_costs_no_request_until_state_migrate_moves_it() -> None:
    store = MemoryStore()
    ops.set_state(store, "job", bookmarks(users=1), TERMS)
    # a snapshot an earlier version kept beside the state, older than the one just written
    old_name = "20200101T000000.000000Z-old-run"
    doc = {"run_id": "old-run", "note": "", "singer_state": bookmarks(users=0)}
    store.create(f"job/history/{old_name}.json", orjson.dumps(doc))

    listed: list[str] = []
    real_list = store.list

    def counting_list(prefix: str = "") -> Iterator[str]:
        listed.append(prefix)
        return real_list(prefix)

    store.list = counting_list  # type: ignore[method-assign]
    ops.set_state(store, "job", bookmarks(users=2), TERMS)  # a write lists the new place only
    assert "job/history/" not in listed, listed
    assert [s.value for s in history.list_snapshots(store, "job")] == [
        bookmarks(users=1),
        bookmarks(users=2),
    ]
    store.list = real_list  # type: ignore[method-assign]

    assert history.migrate_legacy(store) == 1  # `state migrate`, or `meltano upgrade`
    assert not [k for k in store.list("job/") if "/history/" in k]
    assert f".mapper-state/history/job/{old_name}.json" in set(store.list())
    assert [s.value for s in history.list_snapshots(store, "job")] == [
        bookmarks(users=0),
        bookmarks(users=1),
        bookmarks(users=2),
    ]
    assert history.delete_all(store, "job") == 3
    assert sorted(store.list()) == ["job/state.json"]


def test_clearing_the_history_also_removes_what_an_earlier_version_left() -> None:
    store = MemoryStore()
    ops.set_state(store, "job", bookmarks(users=1), TERMS)
    store.create("job/history/20200101T000000.000000Z-old-run.json", b'{"singer_state": {}}')
    assert history.delete_all(store, "job") == 2
    assert history.migrate_legacy(store) == 0  # nothing comes back


def test_listing_states_does_not_page_through_the_history(s3_location: StoreLocation) -> None:
    """On S3, `state list` costs pages in proportion to the states, not to their history."""
    store = s3_location.open()
    paging = CloudPaging(store)
    paging.set_page_size(10)
    for n in range(5):
        state.save(store, f"id-{n}", bookmarks(users=n), None)
        for run in range(20):  # 100 snapshots in all: 10 more pages if they were listed
            history.write_snapshot(
                store, f"id-{n}", {}, run_id=f"r{run}", keep=50, host="", command=""
            )
    paging.count()
    assert ops.list_state_ids(store) == [f"id-{n}" for n in range(5)]
    # one page that runs into the history (it sorts before "id-"), then one past it
    assert paging.pages() == 2, paging.pages()
