"""The checkpointer: newest state wins, at most one write per interval, off the stream.

The pump offers every state it sees; the newest is written at most once per
``checkpoint_interval_seconds``, so a slow store never slows the stream. The writes are
made by the lease's heartbeat thread, as its chore between renewals
(:class:`mapper_state.core.lease.Chore`): a run starts one thread, and a checkpoint's
store calls end by the lease's deadline. ``finish`` writes the last state in the caller's
thread before exit; ``abandon`` stops without writing anything more (the target died:
states it did not confirm must not be stored).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from mapper_state import log, runtime, signals
from mapper_state.errors import LeaseLost, MapperStateError
from mapper_state.stores.base import StoreError

_NOTHING = object()


class Checkpointer:
    """Coalesces offered states and commits the newest through ``commit``, when the
    heartbeat calls :meth:`run` (``wake`` tells it a state was offered)."""

    def __init__(
        self, commit: Callable[[Any], None], interval: float, wake: Callable[[], None]
    ) -> None:
        self._commit = commit
        self.interval = interval
        self._wake = wake
        #: Guards ``_pending`` and ``_stopping``: the pump's thread offers, the heartbeat takes.
        self._lock = threading.Lock()
        #: Clear while the heartbeat writes a checkpoint: ``finish`` waits for it to end.
        self._idle = runtime.event()
        self._idle.set()
        self._pending: Any = _NOTHING
        self._stopping = False
        self._last_write = float("-inf")
        self.failure: MapperStateError | None = None
        self.commits = 0

    def offer(self, value: Any) -> None:
        """Called by the pump for each state; cheap, never blocks on the store."""
        with signals.HELD:  # a signal must not leave a lock taken (ours, or the wake-up's)
            with self._lock:
                self._pending = value
            self._wake()

    def fail(self, error: MapperStateError) -> None:
        """Stop committing: e.g. the heartbeat found the lease lost."""
        if self.failure is None:
            self.failure = error

    def check(self) -> None:
        """Raise the failure, if any, so the stream stops."""
        if self.failure is not None:
            raise self.failure

    # -- the heartbeat's chore ---------------------------------------------------------
    def due_in(self) -> float | None:
        """Seconds until the newest state is due to be written; ``None``: nothing to write."""
        if self._pending is _NOTHING or self._stopping or self.failure is not None:
            return None
        return self._last_write + self.interval - runtime.monotonic()

    def run(self) -> None:
        """Write the newest state (in the heartbeat's thread); :class:`LeaseLost` if the
        lease turned out lost. A store failure is a warning: the state is tried again."""
        with self._lock:
            if self._stopping or self.failure is not None or self._pending is _NOTHING:
                return
            value, self._pending = self._pending, _NOTHING
            self._idle.clear()
        try:
            self._write(value, background=True)
        finally:
            self._idle.set()

    def _write(self, value: Any, *, background: bool) -> None:
        try:
            self._commit(value)
            self.commits += 1
        except LeaseLost as exc:
            self.fail(exc)
            raise
        except StoreError as exc:
            if not background:
                raise
            log.warning(f"checkpoint failed, will retry: {exc.message}")
            with self._lock:  # keep the newest: put ours back unless a newer one came
                if self._pending is _NOTHING:
                    self._pending = value
        except MapperStateError as exc:
            if not background:
                raise
            self.fail(exc)  # the stream stops on it, as on a lost lease
        finally:
            self._last_write = runtime.monotonic()

    # -- the end of the run ----------------------------------------------------------
    def _stop(self) -> None:
        """No more writes from the heartbeat (one in progress goes on to its end)."""
        with signals.HELD, self._lock:
            self._stopping = True

    def finish(self) -> bool:
        """Write the newest uncommitted state now; return whether anything was written."""
        self._stop()
        self._idle.wait()  # a checkpoint the heartbeat is writing ends first (by its deadline)
        self.check()
        with signals.HELD, self._lock:
            value, self._pending = self._pending, _NOTHING
        if value is _NOTHING:
            return False
        self._write(value, background=False)
        return True

    def abandon(self) -> None:
        """Stop without writing what has not been committed yet. A write the heartbeat has
        in progress ends by its deadline (and is fenced): stopping the heartbeat waits for it."""
        self._stop()
        with signals.HELD, self._lock:
            self._pending = _NOTHING
