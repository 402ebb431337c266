"""``mapper-state state migrate`` (and the state backend's ``migrate()``, which calls the same
function): snapshots older versions kept in ``<ID>/history/`` move to today's place, once."""

from __future__ import annotations

import orjson

from mapper_state.core import history
from mapper_state.stores.memory import MemoryStore


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
