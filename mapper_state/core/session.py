"""A run's hold on one state ID: lease, prior state, fenced commits, final snapshot, release.

The filter and ``run`` share this: both take the lease, read the prior state,
commit states through a :class:`Checkpointer` (written by the lease's heartbeat, its one
thread) and, on every exit path, release the lease. Each state goes through
:func:`mapper_state.core.commit.commit` (the guard, the lease confirmed by a
compare-and-swap renewal, the state written conditionally on the version last seen:
fencing); the run's last state is kept in the history when it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from mapper_state import log, runtime, signals
from mapper_state.core import bookmarks, commit, inherited, refusal, state
from mapper_state.core.checkpoint import Checkpointer
from mapper_state.errors import ConfigError, LeaseBusy, LeaseLost
from mapper_state.settings import URI_SETTING, Settings
from mapper_state.stores import open_configured_store
from mapper_state.stores.base import BlobStore, StoreError


class RunHooks:
    """Where an orchestrator's rules plug into a run (Meltano's, see ``mapper_state.meltano``).

    The defaults are a plain run's: no extra message for a missing state ID, the
    ``lock_only`` setting as given, no check of the prior state, and a lease released
    at the end by the run itself.
    """

    def missing_state_id(self) -> ConfigError | None:
        """The error to raise when no state ID is set, if a more helpful one is known."""
        return None

    def lock_only(self, settings: Settings) -> bool:
        """Hold the lease but leave ``state.json`` to another writer?"""
        return bool(settings.lock_only)

    def check_prior(self, settings: Settings, prior: state.StateSnapshot, where: str) -> None:
        """Refuse the run (raise) when the prior state is not the one the tap was given."""

    def hand_over(self, lease: inherited.AnyLease, settings: Settings) -> bool:
        """After a finished run: hand the lease to someone else? ``True`` if it was."""
        return False


class Session:
    """Use as a context manager; commit with :meth:`offer`, end with :meth:`finish`."""

    def __init__(
        self,
        settings: Settings,
        store: BlobStore | None = None,
        hooks: RunHooks | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.hooks = hooks or RunHooks()
        if not (settings.state_id or "").strip() and (missing := self.hooks.missing_state_id()):
            raise missing
        self.state_id = state.validate_state_id(settings.state_id)
        #: A store the session opened is closed when it ends; one it was given is the giver's.
        self._owns_store = store is None
        self.store = store or open_configured_store(settings)
        # an enclosing run's (named in ``env``, default the environment), or ours
        self.lease = inherited.lease_for(self.store, self.state_id, settings, env)
        self.lock_only = self.hooks.lock_only(settings)
        self.dry_run = settings.dry_run
        self.prior: state.StateSnapshot | None = None
        #: The state as stored: read at the start, then as this run last wrote it.
        self._current = state.StateSnapshot(self.state_id, None, None)
        self.committed: Any = None
        self.writes = 0
        self.last_commit_at: float | None = None
        self.checkpointer: Checkpointer | None = None
        self.finished = False
        self.guard = bookmarks.CommitGuard(settings, self.state_id)
        self._options = commit.Options(
            history_keep=settings.history_keep,
            run_write=True,
            judge=self._judge,
            record=False,  # the run's last state only, when it ends
            skip_unchanged=True,
        )
        self.lease_wait_seconds = 0.0
        #: Called after each state write (e.g. to write metrics).
        self.on_commit: Callable[[], None] | None = None
        self._exit_stack = contextlib.ExitStack()

    def __enter__(self) -> Session:
        with contextlib.ExitStack() as stack:  # a failure here unwinds what was set up
            if self._owns_store:
                stack.callback(self.store.close)
            stack.callback(self.release)
            stack.callback(self._stop)
            self._acquire()
            self.prior = self._load_fenced()
            self.hooks.check_prior(self.settings, self.prior, self.store.display_uri)
            with signals.deferred():
                self._current = self.prior
                self.checkpointer = Checkpointer(
                    self._commit, self.settings.checkpoint_interval, wake=self.lease.wake
                )
                self.lease.start_heartbeat(on_lost=self._lost, chore=self.checkpointer)
            self._exit_stack = stack.pop_all()
        return self

    def _acquire(self) -> None:
        """Take the lease, counting the time spent waiting for it (even when it fails)."""
        started = runtime.monotonic()
        try:
            self.lease.acquire()
        except LeaseBusy as exc:
            origin = self.settings.origin(URI_SETTING)
            raise refusal.busy(exc, self.store, self.state_id, origin, refusal.RETRY_HINT) from None
        finally:
            self.lease_wait_seconds = runtime.monotonic() - started

    def _load_fenced(self) -> state.StateSnapshot:
        """The prior state; after taking over from a holder that may still be writing, fenced.

        A holder whose lease expired (frozen, partitioned) or was broken may have a state
        write still in flight, conditional on the version it last saw. Rewriting the
        state now (same value, next serial: new bytes, so a new version on every store)
        makes any such write fail; one that landed first is read back and kept.
        """
        for _ in range(5):
            prior = state.load(self.store, self.state_id)
            if self.lease.took_over is None or not prior.exists or not self.writes_state:
                return prior
            try:
                fenced = commit.fence(self.store, prior, self.lease)
            except LeaseLost:
                continue  # the previous holder's write landed first: read it again
            log.info(
                f"took over the expired lease of run {self.lease.took_over.run_id} on "
                f"{self.state_id}; its writes still in flight will be refused"
            )
            return fenced
        raise LeaseLost(f"the state of {self.state_id} keeps changing after the takeover")

    def _lost(self, error: LeaseLost) -> None:
        """The heartbeat lost the lease: stop committing, and stop the stream now."""
        assert self.checkpointer is not None
        self.checkpointer.fail(error)
        signals.wake_main()  # the main thread raises it even if it waits for input

    def __exit__(self, *exc: object) -> None:
        """Stop renewing and committing, release (or hand over) the lease, close the store."""
        self._exit_stack.close()

    def _stop(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.abandon()  # nothing more is written...
        self.lease.stop_heartbeat()  # ...once a checkpoint in progress has ended

    @property
    def tap_state(self) -> Any:
        """The state to hand the tap, ``None`` for none (or a full refresh), without the
        bookmarks of ``--full-refresh-stream`` streams."""
        return bookmarks.for_tap(self.settings, self.prior.value if self.prior else None)

    @property
    def handoff_value(self) -> Any:
        """The state to hand the tap: ``{}`` when there is none or on a full refresh."""
        value = self.tap_state
        return {} if value is None else value

    @property
    def writes_state(self) -> bool:
        return not (self.lock_only or self.dry_run)

    def offer(self, value: Any) -> None:
        assert self.checkpointer is not None
        if self.writes_state and (refusal := self.guard.admit(self._current.value, value)):
            self._warn(refusal)
            return
        self.checkpointer.offer(value)

    def _warn(self, verdict: bookmarks.Verdict) -> None:
        if verdict.warning and self.guard.first_time(verdict.warning):
            log.warning(verdict.warning)

    def check(self) -> None:
        """Raise what stops the stream (once per chunk): a failure the heartbeat found, or a
        lease that ran out while this process was not running (stopped, frozen, paused)
        before its heartbeat could say so."""
        assert self.checkpointer is not None
        self.checkpointer.check()
        if (lost := self.lease.lapse()) is not None:
            raise LeaseLost(f"{lost.message}; not passing more data")

    def _judge(self, stored: Any, new: Any) -> bookmarks.Verdict:
        verdict = self.guard.check(stored, new)
        self._warn(verdict)
        return verdict

    def _commit(self, value: Any) -> None:
        if not self.writes_state:
            self.committed = value  # nothing to fence: the heartbeat keeps the lease
            return
        if self.settings.state_merge:
            value = state.deep_merge(self._current.value, value)
        outcome = commit.commit(self.store, self.lease, self._current, value, self._options)
        if not outcome.wrote:
            return  # refused (the stored state stays), or the store holds this already
        self._current = outcome.stored
        self.committed = outcome.stored.value
        self.guard.committed(outcome.stored.value)
        self.writes += 1
        self.last_commit_at = runtime.now()
        if self.on_commit is not None:
            self.on_commit()

    @property
    def commits(self) -> int:
        """State writes made (a state equal to the stored one is not written again)."""
        return self.writes

    def finish(self) -> bool:
        """Write the last state now and keep a history snapshot of it."""
        assert self.checkpointer is not None
        wrote = self.checkpointer.finish()
        self.finished = True
        if self.writes:
            commit.record_written(
                self.store, self.state_id, self.committed, self.lease, self._options
            )
        return wrote

    def release(self) -> None:
        if self.finished and self.hooks.hand_over(self.lease, self.settings):
            return  # e.g. a Meltano mapping: held until Meltano has written its state
        try:
            self.lease.release()
        except StoreError as exc:
            log.warning(f"could not release the lease on {self.state_id}: {exc.message}")
