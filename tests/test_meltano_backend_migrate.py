"""``mapper-state state migrate`` (and the state backend's ``migrate()``, which calls the same
function): snapshots older versions kept in ``<ID>/history/`` move to today's place, once."""

from __future__ import annotations

from pathlib import Path

import orjson

from mapper_state.core import history
from mapper_state.stores import open_store
from mapper_state.stores.memory import MemoryStore
from tests.support.cli import invoke


def test_old_snapshots_move_once_and_stay_readable() -> None:
    store = MemoryStore()
    store.create("a/state.json", b"{}")
    for state_id in ("a", "nested/b"):
        doc = {"run_id": "old", "singer_state": {"bookmarks": {state_id: 1}}}
        store.create(f"{state_id}/history/20200101T000000.000000Z-old.json", orjson.dumps(doc))
    store.create("c/history/not-a-snapshot.json", b"{}")  # a state ID's own key, not history

    assert history.migrate_legacy(store) == 2
    keys = set(store.list())
    assert ".mapper-state/history/a/20200101T000000.000000Z-old.json" in keys
    assert ".mapper-state/history/nested/b/20200101T000000.000000Z-old.json" in keys
    assert not [k for k in keys if k.startswith(("a/history/", "nested/b/history/"))]
    assert "c/history/not-a-snapshot.json" in keys
    assert [s.value for s in history.list_snapshots(store, "nested/b")] == [
        {"bookmarks": {"nested/b": 1}}
    ]
    assert history.migrate_legacy(store) == 0


def test_state_migrate_says_what_it_did_and_where(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/store"
    store = open_store(uri)
    doc = {"run_id": "old", "singer_state": {"bookmarks": {"s": 1}}}
    store.create("a/history/20200101T000000.000000Z-old.json", orjson.dumps(doc))
    first = invoke("state", "migrate", "--state-backend-uri", uri)
    assert first.returncode == 0, first.stderr
    assert first.stdout.decode() == f"{uri}: moved 1 snapshot to {history.HISTORY_ROOT}\n"
    again = invoke("state", "migrate", "--state-backend-uri", uri)
    assert again.stdout.decode() == f"{uri}: moved 0 snapshots to {history.HISTORY_ROOT}\n"
