"""``state diff ID [SNAPSHOT [SNAPSHOT]]``: which bookmark moved from what to what.

Two states are compared stream by stream (``bookmarks.<stream>``, see
:mod:`mapper_state.core.bookmarks`): a stream is added, removed or changed, and for a
changed one each leaf that moved is listed with its old and new value (singer-sdk's
``partitions`` are matched by their ``context``; any other list is one leaf). Keys beside ``bookmarks`` (e.g.
``currently_syncing``) are compared the same way. The sides are history snapshots
(a name or its unique start) or ``current``, the stored state now: by default the
two newest snapshots; with one snapshot, from it to the current state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from mapper_state import jsonio
from mapper_state.core import bookmarks, history, state
from mapper_state.errors import BadInput, StateNotFound
from mapper_state.stores.base import BlobStore

CURRENT = "current"
ChangeKind = Literal["added", "removed", "changed"]


@dataclass(frozen=True)
class Side:
    """One side of a diff: a snapshot, the current state, or nothing before the first."""

    label: str
    time: datetime | None = None
    run_id: str | None = None
    value: Any = None


@dataclass(frozen=True)
class Change:
    """A leaf that moved: its path (dotted, within the stream), and its two values."""

    path: str
    kind: ChangeKind
    old: Any = None
    new: Any = None


@dataclass(frozen=True)
class StreamChange:
    stream: str
    kind: ChangeKind
    changes: tuple[Change, ...]


@dataclass(frozen=True)
class StateDiff:
    state_id: str
    old: Side
    new: Side
    streams: tuple[StreamChange, ...] = ()
    other: tuple[Change, ...] = ()
    unchanged: tuple[str, ...] = field(default_factory=tuple)

    @property
    def moved(self) -> bool:
        return bool(self.streams or self.other)


def leaf_changes(old: Any, new: Any, path: str = "") -> list[Change]:
    """Every leaf that differs between ``old`` and ``new`` (objects are walked, lists are leaves)."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return _keyed_changes(old, new, lambda key: f"{path}.{key}" if path else str(key))
    if _partitions(old) and _partitions(new):
        return _partition_changes(old, new, path)
    return [Change(path, "changed", old=old, new=new)]


def _partitions(value: Any) -> bool:
    """Is ``value`` singer-sdk's ``partitions``: a list of objects, each with its ``context``?"""
    return isinstance(value, list) and all(isinstance(p, dict) and "context" in p for p in value)


def _partition_changes(old: list[Any], new: list[Any], path: str) -> list[Change]:
    """Partitions matched by their context: ``partitions[{"shop":1}].replication_key_value``."""

    def by_context(parts: list[Any]) -> dict[str, Any]:
        return {
            jsonio.dumps(p["context"], sort_keys=True).decode(): {
                k: v for k, v in p.items() if k != "context"
            }
            for p in parts
        }

    before, after = by_context(old), by_context(new)
    if len(before) != len(old) or len(after) != len(new):  # contexts repeat: compare whole
        return [Change(path, "changed", old=old, new=new)]
    return _keyed_changes(before, after, lambda context: f"{path}[{context}]")


def _keyed_changes(
    old: dict[Any, Any], new: dict[Any, Any], where: Callable[[Any], str]
) -> list[Change]:
    """The changes between two mappings, key by key (old's keys first), each at ``where(key)``."""
    found: list[Change] = []
    for key in [*old, *(k for k in new if k not in old)]:
        child = where(key)
        if key not in new:
            found.append(Change(child, "removed", old=old[key]))
        elif key not in old:
            found.append(Change(child, "added", new=new[key]))
        else:
            found += leaf_changes(old[key], new[key], child)
    return found


def compare(state_id: str, old: Side, new: Side) -> StateDiff:
    """The per-stream differences from ``old`` to ``new``."""
    before, after = bookmarks.bookmarks_of(old.value), bookmarks.bookmarks_of(new.value)
    streams: list[StreamChange] = []
    unchanged: list[str] = []
    for stream in sorted({*before, *after}):
        if stream not in after:
            streams.append(
                StreamChange(stream, "removed", (Change("", "removed", before[stream]),))
            )
        elif stream not in before:
            streams.append(StreamChange(stream, "added", (Change("", "added", new=after[stream]),)))
        elif before[stream] == after[stream]:
            unchanged.append(stream)
        else:
            changes = leaf_changes(before[stream], after[stream])
            streams.append(StreamChange(stream, "changed", tuple(changes)))

    def rest(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            return {}
        return {k: v for k, v in value.items() if k != bookmarks.BOOKMARKS}

    other = leaf_changes(rest(old.value), rest(new.value))
    return StateDiff(state_id, old, new, tuple(streams), tuple(other), tuple(unchanged))


def _snapshot_side(snapshots: list[history.Snapshot], ref: str, state_id: str) -> Side:
    snap = history.find_one(snapshots, ref, state_id)
    return Side(snap.name, snap.time, snap.run_id, snap.value)


def diff(store: BlobStore, state_id: str, refs: tuple[str, ...] = ()) -> StateDiff:
    """Compare two snapshots (or a snapshot and ``current``) of ``state_id``; see the module."""
    if len(refs) > 2:
        raise BadInput("give at most two snapshots")
    snapshots = history.list_snapshots(store, state_id)
    current_needed = len(refs) == 1 or CURRENT in refs

    def side(ref: str) -> Side:
        if ref == CURRENT:
            loaded = state.load(store, state_id)
            if not loaded.exists:
                return Side(CURRENT)
            return Side(CURRENT, value={} if loaded.value is None else loaded.value)
        return _snapshot_side(snapshots, ref, state_id)

    if not snapshots and not current_needed:
        raise StateNotFound(f"state ID {state_id} has no history in {store.display_uri}")
    if not refs:
        newest = snapshots[-1]
        new = Side(newest.name, newest.time, newest.run_id, newest.value)
        if len(snapshots) == 1:
            return compare(state_id, Side("(nothing)"), new)
        older = snapshots[-2]
        return compare(state_id, Side(older.name, older.time, older.run_id, older.value), new)
    if len(refs) == 1:
        return compare(state_id, side(refs[0]), side(CURRENT))
    return compare(state_id, side(refs[0]), side(refs[1]))
