"""One stream at a time: ``state get|set|clear ID --stream S``.

A full refresh of one stream should need neither a hand-edited JSON file nor clearing
every stream. These commands read or change ``bookmarks.<stream>`` only (see
:mod:`mapper_state.core.bookmarks` for the shapes understood), under the lease and with
history snapshots like every other write, so ``state rollback`` undoes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mapper_state.core import bookmarks, history
from mapper_state.core.state import StateSnapshot
from mapper_state.errors import BadInput, StateNotFound
from mapper_state.ops.reading import get_state, not_found
from mapper_state.ops.writes import WriteTerms, write_with
from mapper_state.stores.base import BlobStore


def _held(value: Any) -> str:
    held = bookmarks.streams(value)
    return f"it has bookmarks for {', '.join(held)}" if held else "it has no bookmarks"


def _no_bookmark(state_id: str, value: Any, missing: Sequence[str]) -> StateNotFound:
    which = "streams " + ", ".join(missing) if len(missing) > 1 else f"stream {missing[0]}"
    return StateNotFound(f"the state of {state_id} has no bookmark for {which} ({_held(value)})")


def get_stream(store: BlobStore, state_id: str, stream: str) -> Any:
    """The bookmark of ``stream`` in the state of ``state_id``."""
    value = get_state(store, state_id)
    try:
        return bookmarks.bookmark(value, stream)
    except KeyError:
        raise _no_bookmark(state_id, value, [stream]) from None


def set_stream(store: BlobStore, state_id: str, stream: str, value: Any, terms: WriteTerms) -> Any:
    """Replace the bookmark of ``stream`` (a state is created if there is none); return it all."""
    if value is None:
        raise BadInput(
            f"a bookmark cannot be null; `state clear {state_id} --stream {stream}` removes it"
        )

    def replaced(snapshot: StateSnapshot) -> Any:
        return bookmarks.with_stream(snapshot.value, stream, value)

    return write_with(store, state_id, terms, replaced, f"state set --stream {stream}")


def clear_streams(
    store: BlobStore, state_id: str, streams: Sequence[str], terms: WriteTerms
) -> str | None:
    """Remove the bookmarks of ``streams`` only; every one must be there. Return the name
    of the snapshot that restores them, if the history keeps one."""

    def cleared(snapshot: StateSnapshot) -> Any:
        if not snapshot.exists:
            raise not_found(store, state_id)
        missing = [s for s in streams if s not in bookmarks.bookmarks_of(snapshot.value)]
        if missing:
            raise _no_bookmark(state_id, snapshot.value, missing)
        return bookmarks.without_streams(snapshot.value, streams)

    note = "state clear " + " ".join(f"--stream {s}" for s in streams)
    write_with(store, state_id, terms, cleared, note)
    kept = history.snapshot_names(store, state_id)
    return kept[-2] if len(kept) > 1 else None
