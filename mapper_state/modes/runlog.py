"""What a mode's run leaves in the store about itself: the filter's, ``run``'s, ``exec``'s.

A mode builds a :class:`RunLog`, enters its lease through it (:meth:`RunLog.enter` for a
:class:`~mapper_state.core.session.Session`, :meth:`RunLog.acquire` for a bare lease) and
runs its body through :meth:`RunLog.recorded` (or ``with run_log:``), which turns the exit
code (or the error that ends the run) into the record's outcome
(:mod:`mapper_state.core.recorder`). The store a session uses is opened here and closed
only after the end of the record is written, so the run's last request reuses its
connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from mapper_state.core.recorder import Counts, RunRecorder, exit_code_of
from mapper_state.core.session import Session
from mapper_state.errors import ExitCode, LeaseBusy
from mapper_state.settings import Settings
from mapper_state.stores import open_configured_store
from mapper_state.stores.base import BlobStore

__all__ = ["Counts", "RunLog"]


class RunLog(RunRecorder):
    """One mode's run record, from taking the lease to the exit code."""

    def __init__(self, settings: Settings, mode: str, store: BlobStore | None = None) -> None:
        super().__init__(store, keep=settings.runs_keep, mode=mode, waits=settings.lock_wait > 0)
        self.settings = settings
        self._owns_store = store is None
        self.session: Session | None = None
        #: The run's counts, wired in by the mode.
        self.counts: Callable[[], Counts] = Counts
        #: The run's exit status, once known (an error ending the run gives its own).
        self.code = int(ExitCode.INTERNAL)

    def store_for_session(self) -> BlobStore | None:
        """The store for the run's session (opened here), or ``None`` without a state ID
        (the session then says what is missing)."""
        if self._store is None and (self.settings.state_id or "").strip():
            self._store = open_configured_store(self.settings)
        return self._store

    def enter(self, session: Session, stack: contextlib.ExitStack) -> Session:
        """Enter ``session`` on ``stack`` (it takes the lease), recording the run."""
        self.session = session
        try:
            stack.enter_context(session)
        except LeaseBusy:
            self.refused(session.lease, session.lease_wait_seconds)
            raise
        self.acquired(session.lease, session.lease_wait_seconds)
        return session

    def recorded(self, body: Callable[[], int]) -> int:
        """Run ``body``; end the record with its exit code (or its error's), close the store."""
        with self:
            self.code = body()
        return self.code

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        """End the record with :attr:`code`, or with the code of the error ending the run."""
        try:
            session = self.session
            committed = session.writes if session else 0
            self.end(exit_code_of(exc) if exc is not None else self.code, self.counts(), committed)
        finally:
            self.close()

    def close(self) -> None:
        if self._owns_store and self._store is not None:
            store, self._store = self._store, None
            with contextlib.suppress(Exception):
                store.close()
