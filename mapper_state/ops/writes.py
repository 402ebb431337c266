"""Changing states the way a run does: under the lease, fenced, with history kept.

Every write takes the lease on the state ID, reads the state and its version, and
commits through :mod:`mapper_state.core.commit` (the lease confirmed, the state written
only if it is still at that version), so an operator can never interleave with a
running pipeline. Before a state is changed or cleared its current value is kept in
the history (if the newest snapshot does not already hold it), so every change is
undoable with ``state rollback``. An operator's write is explicit: the empty-state
guard of a run does not stand in its way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Protocol

from mapper_state.core import commit, history, inherited, state
from mapper_state.core.lease import read_lease
from mapper_state.core.state import StateSnapshot
from mapper_state.errors import BadInput, LeaseBusy, MapperStateError, StateNotFound
from mapper_state.ops.fetch import fetch_all
from mapper_state.ops.reading import not_found
from mapper_state.settings import Settings
from mapper_state.stores.base import BlobStore


class StateExists(BadInput):
    """A copy, move or import would overwrite a state without ``--force``."""


@dataclass(frozen=True)
class WriteTerms:
    """The terms of an operator's write: how it takes the lease, how much history it keeps."""

    ttl: float
    retry: float
    wait: float
    history_keep: int
    #: Secret values in force, hidden from the command line the lease and history keep.
    secret_values: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> WriteTerms:
        return cls(
            ttl=settings.lock_timeout,
            retry=settings.lock_retry,
            wait=settings.lock_wait,
            history_keep=settings.history_keep,
            secret_values=tuple(settings.secrets()),
        )

    def secrets(self) -> list[str]:
        return list(self.secret_values)

    @property
    def lock_timeout(self) -> float:
        return self.ttl

    @property
    def lock_retry(self) -> float:
        return self.retry

    @property
    def lock_wait(self) -> float:
        return self.wait

    def lease(self, store: BlobStore, state_id: str) -> inherited.AnyLease:
        return inherited.lease_for(store, state_id, self)  # an enclosing exec's, or ours


def _options(terms: WriteTerms, note: str = "", *, keep_prior: bool = True) -> commit.Options:
    """An operator's write: not guarded, the prior state kept in the history first."""
    return commit.Options(note=note, history_keep=terms.history_keep, keep_prior=keep_prior)


def _commit(
    store: BlobStore,
    lease: inherited.AnyLease,
    snapshot: StateSnapshot,
    value: Any,
    terms: WriteTerms,
    note: str,
) -> None:
    commit.commit(store, lease, snapshot, value, _options(terms, note))


def _remove(
    store: BlobStore,
    lease: inherited.AnyLease,
    snapshot: StateSnapshot,
    terms: WriteTerms,
    *,
    keep_history: bool,
) -> None:
    commit.remove(store, lease, snapshot, _options(terms, keep_prior=keep_history))


def write_with(
    store: BlobStore,
    state_id: str,
    terms: WriteTerms,
    compute: Callable[[StateSnapshot], Any],
    note: str,
) -> Any:
    """Under the lease: read the state, ``compute`` the new one from it, write it (with
    history snapshots before and after); return what was written."""
    with terms.lease(store, state_id) as lease:
        snapshot = state.load(store, state_id)
        value = compute(snapshot)
        _commit(store, lease, snapshot, value, terms, note)
    return value


#: ``set_state`` or ``merge_state``: ``(store, state_id, value, terms)``.
Writer = Callable[[BlobStore, str, Any, WriteTerms], Any]


#: ``copy_state`` or ``move_state``: ``(store, src, dst, terms, *, force)``.
class Transfer(Protocol):
    def __call__(
        self, store: BlobStore, src: str, dst: str, terms: WriteTerms, *, force: bool
    ) -> None: ...


def set_state(store: BlobStore, state_id: str, value: Any, terms: WriteTerms) -> None:
    write_with(store, state_id, terms, lambda _: value, "state set")


def merge_state(store: BlobStore, state_id: str, value: Any, terms: WriteTerms) -> Any:
    """Deep-merge ``value`` over the existing state; return the result."""

    def merged(snapshot: StateSnapshot) -> Any:
        if not snapshot.exists:
            raise not_found(store, state_id)
        return state.deep_merge(snapshot.value or {}, value)

    return write_with(store, state_id, terms, merged, "state merge")


def clear_state(
    store: BlobStore, state_id: str, terms: WriteTerms, *, with_history: bool
) -> str | None:
    """Remove the state, and its history if ``with_history``.

    Returns the newest snapshot's name (the one that restores the state), if any.
    """
    with terms.lease(store, state_id) as lease:
        snapshot = state.load(store, state_id)
        if snapshot.exists:
            _remove(store, lease, snapshot, terms, keep_history=not with_history)
        elif not (with_history and history.snapshot_names(store, state_id)):
            raise not_found(store, state_id)
        if with_history:
            history.delete_all(store, state_id)
            return None
        names = history.snapshot_names(store, state_id)
        return names[-1] if names else None


def refuse_busy(store: BlobStore, state_ids: list[str], what: str) -> None:
    """Fail before touching anything if any of ``state_ids`` is held by a live run."""
    now = time.time()
    for state_id, (holder, _) in fetch_all(state_ids, lambda i: read_lease(store, i)):
        if holder is not None and not holder.is_expired(now):
            raise LeaseBusy(f"{what}: state ID {state_id} is busy: {holder.describe()}")


def each_state(state_ids: list[str], action: Callable[[str], object], verb: str) -> None:
    """Run ``action`` on each state ID in turn; a failure says how many were ``verb`` before."""
    for done, state_id in enumerate(state_ids):
        try:
            action(state_id)
        except MapperStateError as exc:
            raise MapperStateError(
                f"{verb} {done} of {len(state_ids)} states, then stopped at {state_id}: "
                f"{exc.message}",
                exit_code=exc.exit_code,
            ) from None


def clear_many(
    store: BlobStore, state_ids: list[str], terms: WriteTerms, *, with_history: bool
) -> None:
    refuse_busy(store, state_ids, "nothing cleared")
    each_state(
        state_ids,
        lambda i: clear_state(store, i, terms, with_history=with_history),
        "cleared",
    )


def refuse_existing(snapshot: StateSnapshot, force: bool) -> None:
    if snapshot.exists and not force:
        raise StateExists(f"state ID {snapshot.state_id} exists already; add --force to replace it")


def copy_state(store: BlobStore, src: str, dst: str, terms: WriteTerms, *, force: bool) -> None:
    if src == dst:
        raise BadInput("the source and destination are the same state ID")
    source = state.load(store, src)
    if not source.exists:
        raise not_found(store, src)

    def value(target: StateSnapshot) -> Any:
        refuse_existing(target, force)
        return source.value

    write_with(store, dst, terms, value, f"state copy from {src}")


def move_state(store: BlobStore, src: str, dst: str, terms: WriteTerms, *, force: bool) -> None:
    """Copy ``src`` onto ``dst`` and remove ``src``, holding both leases (taken in name order)."""
    if src == dst:
        raise BadInput("the source and destination are the same state ID")
    with ExitStack() as stack:
        leases: dict[str, inherited.AnyLease] = {}
        for i in sorted((src, dst)):
            leases[i] = terms.lease(store, i)
            stack.enter_context(leases[i])
        source = state.load(store, src)
        if not source.exists:
            raise not_found(store, src)
        target = state.load(store, dst)
        refuse_existing(target, force)
        _commit(store, leases[dst], target, source.value, terms, f"state move from {src}")
        try:
            _remove(store, leases[src], source, terms, keep_history=True)
        except MapperStateError as exc:
            raise MapperStateError(
                f"copied {src} to {dst} ({dst} holds the state now) but could not remove "
                f"{src}, which still holds it too: {exc.message}; run `mapper-state state "
                f"clear {src}` once the store allows",
                exit_code=exc.exit_code,
            ) from None


def rollback(
    store: BlobStore, state_id: str, ref: str, terms: WriteTerms
) -> tuple[history.Snapshot, bool]:
    """Restore the snapshot ``ref`` names; return it and whether anything changed."""
    with terms.lease(store, state_id) as lease:
        snapshots = history.list_snapshots(store, state_id)
        if not snapshots:
            raise StateNotFound(f"state ID {state_id} has no history in {store.display_uri}")
        target = history.find_one(snapshots, ref, state_id)
        current = state.load(store, state_id)
        if current.exists and current.value == target.value:
            return target, False
        _commit(store, lease, current, target.value, terms, f"state rollback to {target.name}")
        return target, True
