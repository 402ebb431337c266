"""Reading the run records back: ``mapper-state runs ID`` and the fleet's last runs.

One state ID's records are one listing and one read each, plus one read of its lease to
tell a run still going (``running``) from one killed before it could end its record
(``killed``). For the whole fleet, one listing of :data:`~mapper_state.core.runs.RUNS_ROOT`
finds every state ID's newest record by name, without reading any.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mapper_state.core import runs
from mapper_state.core.lease import read_lease
from mapper_state.core.runs import FAILED, SIGNALLED, RunRecord, iso
from mapper_state.stores.base import BlobStore, Entry, listing

__all__ = ["FAILED", "FAILING", "SIGNALLED", "Run", "RunRecord", "iso", "run_history"]

#: Outcomes ``state list --failed`` selects: the run did not end well.
FAILING = frozenset({runs.FAILED, runs.SIGNALLED, runs.LEASE_LOST, runs.KILLED})


@dataclass(frozen=True)
class Run:
    """A record as read back, with the outcome it shows now."""

    record: runs.RunRecord
    outcome: str


def run_history(store: BlobStore, state_id: str) -> list[Run]:
    """Every record of ``state_id``, newest first, each with its outcome."""
    records = runs.list_records(store, state_id)
    if not records:
        return []
    holder = None
    if any(r.status == runs.RUNNING for r in records):
        holder, _ = read_lease(store, state_id)
    now = time.time()
    return [Run(r, runs.outcome_of(r, holder, now)) for r in records]


def newest_entries(store: BlobStore, prefix: str = "") -> dict[str, Entry]:
    """``{state ID: its newest record's listing entry}`` from one listing of the records."""
    newest: dict[str, tuple[str, Entry]] = {}
    for entry in listing(store, runs.RUNS_ROOT + prefix):
        found = runs.split_key(entry.key)
        if found is None:
            continue
        state_id, name = found
        if state_id not in newest or name > newest[state_id][0]:
            newest[state_id] = (name, entry)
    return {state_id: entry for state_id, (_, entry) in newest.items()}


def name_of(entry: Entry) -> str:
    found = runs.split_key(entry.key)
    assert found is not None
    return found[1]
