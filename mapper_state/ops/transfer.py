"""``state export`` and ``state import``: every state as JSON lines, and back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mapper_state import jsonio
from mapper_state.core import state
from mapper_state.core.state import StateSnapshot
from mapper_state.ops.fetch import fetch_all
from mapper_state.ops.inputs import ImportEntry
from mapper_state.ops.reading import list_state_ids
from mapper_state.ops.writes import (
    StateExists,
    WriteTerms,
    each_state,
    refuse_busy,
    refuse_existing,
    write_with,
)
from mapper_state.stores.base import BlobStore


def export_states(store: BlobStore, pattern: str | None = None) -> Iterator[tuple[str, Any]]:
    """``(state_id, singer_state)`` for every state, in state ID order (read concurrently)."""
    loaded = fetch_all(list_state_ids(store, pattern), lambda i: state.load(store, i))
    for state_id, snapshot in loaded:
        if snapshot.exists:
            yield state_id, {} if snapshot.value is None else snapshot.value


def export_meltano(store: BlobStore, pattern: str | None = None) -> dict[str, Any]:
    """Every state as ``meltano state import`` reads them: ``{state ID: Meltano's document}``."""
    return {i: state.meltano_document(v) for i, v in export_states(store, pattern)}


def export_line(state_id: str, value: Any) -> bytes:
    """One line of ``state export``: ``{"state_id": ..., "singer_state": ...}``."""
    return jsonio.dumps({"state_id": state_id, "singer_state": value}) + b"\n"


def import_states(
    store: BlobStore, entries: list[ImportEntry], terms: WriteTerms, *, force: bool
) -> None:
    """Write every entry, each under its lease; refuse up front if any exists or is busy."""
    if not force:
        loaded = fetch_all([e.state_id for e in entries], lambda i: state.load(store, i))
        existing = [state_id for state_id, snapshot in loaded if snapshot.exists]
        if existing:
            shown = ", ".join(existing[:5]) + (" ..." if len(existing) > 5 else "")
            raise StateExists(
                f"nothing imported: {len(existing)} of these states exist already ({shown}); "
                "add --force to replace them"
            )
    refuse_busy(store, [e.state_id for e in entries], "nothing imported")
    values = {e.state_id: e.value for e in entries}

    def write(state_id: str) -> None:
        def value(target: StateSnapshot) -> Any:
            refuse_existing(target, force)
            return values[state_id]

        write_with(store, state_id, terms, value, "state import")

    each_state(list(values), write, "imported")
