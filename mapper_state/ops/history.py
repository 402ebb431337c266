"""What ``state history`` and ``state migrate`` need of the history, in one call each.

The snapshots themselves are :mod:`mapper_state.core.history`'s; here is the view a
command prints (each snapshot with what it changed, newest first, and which one holds
the current state) and the one-off move of the snapshots older versions kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from mapper_state.core import history, state
from mapper_state.core.history import HISTORY_ROOT, Snapshot
from mapper_state.ops import summary
from mapper_state.ops.reading import not_found
from mapper_state.stores.base import BlobStore

__all__ = ["HISTORY_ROOT", "HistoryView", "Snapshot", "history_view", "migrate_history"]


@dataclass(frozen=True)
class HistoryView:
    """The kept snapshots of a state, newest first, each with a line on what it changed."""

    rows: list[tuple[Snapshot, str]]
    #: The name of the snapshot that holds the current state, if one does.
    current: str | None
    #: Whether the state exists (it may have been cleared, its history kept).
    exists: bool


def history_view(store: BlobStore, state_id: str) -> HistoryView:
    """The history of ``state_id``; :class:`StateNotFound` when it has neither state nor history."""
    snapshots = history.list_snapshots(store, state_id)
    current = state.load(store, state_id)
    if not snapshots and not current.exists:
        raise not_found(store, state_id)
    rows = []
    previous = None
    for snap in snapshots:
        rows.append((snap, summary.summarize_change(previous, snap.value)))
        previous = snap.value
    rows.reverse()
    name = next((s.name for s, _ in rows if current.exists and s.value == current.value), None)
    return HistoryView(rows, name, current.exists)


def migrate_history(store: BlobStore) -> int:
    """Move the snapshots older versions kept beside each state; return how many moved."""
    return history.migrate_legacy(store)
