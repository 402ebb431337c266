"""The one way a state is written: guard, confirm the lease, compare-and-swap, history.

Every writer of ``state.json`` goes through :func:`commit` (or :func:`remove` to clear a
state, :func:`fence` to rewrite it after a takeover): a run's checkpoints (the filter and
``run``, :mod:`mapper_state.core.session`), the operator commands
(:mod:`mapper_state.ops.writes`) and Meltano's state backend add-on. A safety rule changed
here is changed for all of them. The order is fixed:

1. **guard** (a run's write only): the empty-state guard of
   :mod:`mapper_state.core.bookmarks` decides what is written, or refuses the write; a
   refused write touches nothing, not even the lease;
2. **keep the prior state** in the history, when the caller asks (an operator command, a
   state Meltano wrote), unless the newest snapshot holds it already;
3. **confirm the lease**: a compare-and-swap renewal of the lease object. A read would
   only show that the lease *was* ours; a renewal that succeeds proves that no one has
   taken it over or broken it since, and moves its expiry away, so the write right
   after it happens inside a lease that is ours (``Lease.confirm`` is ``Lease.renew``);
4. **compare-and-swap** ``state.json`` on the version read under the lease, with the next
   serial and this run's ID (unique bytes, see :mod:`mapper_state.core.state`);
5. **record** the written state as a history snapshot (a run records only its last state,
   when it ends: :func:`record_written`).

The rule for a failed history snapshot, the same for every writer:

- a snapshot that must exist **before** a write (step 2) that fails stops the write:
  nothing is changed, and the error says so. The state about to be replaced would
  otherwise be lost for good;
- a snapshot of the state just **written** (step 5) that fails is a warning, not an
  error: the state is written and stays written, and failing the command would tell the
  caller (Meltano, a script that retries) that it was not. The state it failed to keep
  is still the current one, so the next operator write keeps it (step 2) before
  replacing it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mapper_state import log, runtime
from mapper_state.core import bookmarks, history, state
from mapper_state.core.deletes import delete_held
from mapper_state.core.state import StateSnapshot, Writer
from mapper_state.errors import LeaseLost
from mapper_state.stores import deadline
from mapper_state.stores.base import BlobStore, PreconditionFailed, StoreError

#: What judges a run's write: ``(stored, new) -> Verdict`` (see :mod:`bookmarks`).
Judge = Callable[[Any, Any], bookmarks.Verdict]


class HeldLease(Protocol):
    """What a commit needs of the lease it writes under.

    :class:`mapper_state.core.lease.Lease` is one; so is the Meltano add-on's view of a
    lease held by the run it belongs to, whose confirmation checks the record instead.
    """

    @property
    def run_id(self) -> str: ...

    @property
    def command(self) -> str: ...

    def confirm(self) -> float | None:
        """Raise :class:`LeaseLost` unless the lease is still this writer's; return the
        seconds the write that follows must end within (the lease's expiry minus the skew
        allowance, by this writer's clock), ``None`` for no bound."""


@dataclass(frozen=True)
class Options:
    """How one commit goes: who wrote it, what is guarded, how much history is kept."""

    #: Which command wrote the state, as the history records it (empty for a run).
    note: str = ""
    #: How many history snapshots to keep (0: no history).
    history_keep: int = 0
    #: A run's write: the empty-state guard stands (an operator's explicit write is not guarded).
    run_write: bool = False
    #: With ``run_write``: let a state without bookmarks replace one with bookmarks.
    allow_reset: bool = False
    #: With ``run_write``: the run's own guard (what it has seen so far) instead of the plain one.
    judge: Judge | None = None
    #: Snapshot the prior state before replacing it, unless the newest snapshot holds it.
    keep_prior: bool = False
    #: Snapshot the written state now (a run snapshots only its last state, at its end).
    record: bool = True
    #: Skip the write when the (guarded) state equals the stored one (a run's checkpoints:
    #: taps open by repeating their state).
    skip_unchanged: bool = False


@dataclass(frozen=True)
class Outcome:
    """What a commit did: ``stored`` is the state as the store now holds it (``prior`` when
    nothing was written), ``wrote`` whether it was written."""

    verdict: bookmarks.Verdict
    stored: StateSnapshot
    wrote: bool = False

    @property
    def refused(self) -> bool:
        return self.verdict.refused


def _judge(prior: StateSnapshot, value: Any, options: Options) -> bookmarks.Verdict:
    if not options.run_write:
        return bookmarks.Verdict(value)
    if options.judge is not None:
        return options.judge(prior.value, value)
    return bookmarks.guard(
        prior.value, value, state_id=prior.state_id, allow_reset=options.allow_reset
    )


def snapshot_prior(store: BlobStore, prior: StateSnapshot, lease: HeldLease, keep: int) -> None:
    """Snapshot the state about to change (unless the newest snapshot holds it); if that
    fails, raise: nothing may be changed."""
    try:
        history.record_if_missing(
            store, prior.state_id, prior.value, keep=keep, command=lease.command
        )
    except StoreError as exc:
        raise StoreError(
            f"could not keep the current state of {prior.state_id} in its history, "
            f"so nothing was changed: {exc.message}"
        ) from None


def record_written(
    store: BlobStore, state_id: str, value: Any, lease: HeldLease, options: Options
) -> None:
    """Snapshot a state just written; a failure is a warning (see the module)."""
    if not options.history_keep:
        return
    try:
        history.record(
            store,
            state_id,
            value,
            run_id=lease.run_id,
            keep=options.history_keep,
            note=options.note,
            command=lease.command,
        )
    except StoreError as exc:
        log.warning(
            f"the state of {state_id} was written, but not its history snapshot: {exc.message}"
        )


def commit(
    store: BlobStore,
    lease: HeldLease,
    prior: StateSnapshot,
    value: Any,
    options: Options,
    *,
    document: dict[str, Any] | None = None,
) -> Outcome:
    """Replace ``prior`` (the state as read under ``lease``) by ``value``: guard, keep the
    prior state, confirm the lease, compare-and-swap, record (in that order, see the module).

    ``document``: Meltano's two halves to store as given (the add-on's writes), whose
    effective Singer state is ``value``; when the guard changes ``value`` (streams kept),
    the ``completed`` half carries the guarded state and ``partial`` stays as written.

    Raises :class:`LeaseLost` when the lease or the state moved on, a ``StoreError`` when
    the store failed (or the prior state could not be kept); nothing is written then.
    """
    verdict = _judge(prior, value, options)
    if verdict.refused:
        return Outcome(verdict, prior)
    if options.skip_unchanged and prior.exists and verdict.value == prior.value:
        return Outcome(verdict, prior)
    if options.keep_prior and prior.exists:
        snapshot_prior(store, prior, lease, options.history_keep)
    if document is not None and verdict.value is not value:
        completed = document.get("completed") or {}
        document = {**document, "completed": {**completed, "singer_state": verdict.value}}
    with _within(lease.confirm()):
        written = _swap(store, prior, verdict.value, lease.run_id, document)
    if options.record:
        record_written(store, prior.state_id, verdict.value, lease, options)
    return Outcome(verdict, written, wrote=True)


def _within(seconds: float | None) -> contextlib.AbstractContextManager[None]:
    """The write after a confirmation ends while the lease it confirmed holds: every
    writer's, whichever lease it writes under (its own, an enclosing run's)."""
    return contextlib.nullcontext() if seconds is None else deadline.within(seconds)


def _swap(
    store: BlobStore,
    prior: StateSnapshot,
    value: Any,
    run_id: str,
    document: dict[str, Any] | None = None,
) -> StateSnapshot:
    """Compare-and-swap ``prior`` to ``value``. A refusal is a lost lease, unless the state
    now holds a later write of this very run (an attempt whose answer was lost, which
    landed unseen): that one is ours, and the write goes on from it."""
    for _ in range(3):
        try:
            return _save(store, prior, value, run_id, document)
        except LeaseLost:
            landed = state.load(store, prior.state_id)
            if not (landed.writer.run_id == run_id and landed.writer.serial >= prior.next_serial):
                raise
            log.info(f"an earlier write of the state of {prior.state_id} had landed; writing on it")
            prior = landed
    return _save(store, prior, value, run_id, document)


def _save(
    store: BlobStore,
    prior: StateSnapshot,
    value: Any,
    run_id: str,
    document: dict[str, Any] | None,
) -> StateSnapshot:
    serial = prior.next_serial
    version = state.save(
        store, prior.state_id, value, prior.version, serial=serial, run_id=run_id, document=document
    )
    halves = state.meltano_document(value) if document is None else state.halves(document)
    writer = Writer(serial, run_id, runtime.now())
    return StateSnapshot(prior.state_id, value, version, writer, halves)


def fence(store: BlobStore, prior: StateSnapshot, lease: HeldLease) -> StateSnapshot:
    """Rewrite ``prior`` as it is (next serial: new bytes, a new version on every store),
    right after taking over a lease, so that a write the previous holder still has in
    flight, conditional on the version it saw, is refused. Raises :class:`LeaseLost`
    when such a write landed first. Like every write, it is made under a confirmed lease
    and ends while that holds."""
    with _within(lease.confirm()):
        return _swap(store, prior, prior.value, lease.run_id)


def remove(store: BlobStore, lease: HeldLease, prior: StateSnapshot, options: Options) -> None:
    """Delete ``prior`` (the state as read under ``lease``): keep it in the history first
    when ``options.keep_prior``, confirm the lease, delete it only at its version."""
    if options.keep_prior:
        snapshot_prior(store, prior, lease, options.history_keep)
    try:
        with _within(lease.confirm()):
            delete_held(store, state.state_key(prior.state_id), prior.version)
    except PreconditionFailed:
        raise LeaseLost(
            f"the state of {prior.state_id} was changed by another writer; not clearing it"
        ) from None
