"""The checkpointer: newest state wins, at most one write per interval, in the background.

The pump offers every state it sees; a background thread writes the newest one
at most once per ``checkpoint_interval_seconds``, so a slow store never slows the
stream. ``finish`` writes the last state synchronously before exit; ``abandon``
stops without writing anything more (the target died: states it did not
confirm must not be stored).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from mapper_state import log, signals
from mapper_state.errors import LeaseLost, MapperStateError
from mapper_state.stores.base import StoreError

_NOTHING = object()


class Checkpointer:
    """Coalesces offered states and commits the newest through ``commit``."""

    def __init__(self, commit: Callable[[Any], None], interval: float) -> None:
        self._commit = commit
        self.interval = interval
        self._cond = threading.Condition()
        self._pending: Any = _NOTHING
        self._stopping = False
        self._last_write = float("-inf")
        self.failure: MapperStateError | None = None
        self.commits = 0
        self._thread = threading.Thread(target=self._run, name="checkpointer", daemon=True)
        self._thread.start()

    def offer(self, value: Any) -> None:
        """Called by the pump for each state; cheap, never blocks on the store."""
        with signals.HELD, self._cond:  # a signal must not leave the lock taken
            self._pending = value
            self._cond.notify()

    def fail(self, error: MapperStateError) -> None:
        """Stop committing: e.g. the heartbeat found the lease lost."""
        with self._cond:
            if self.failure is None:
                self.failure = error
            self._cond.notify()

    def check(self) -> None:
        """Raise the failure, if any, so the stream stops."""
        if self.failure is not None:
            raise self.failure

    def _run(self) -> None:
        while True:
            with self._cond:
                while (
                    not self._stopping
                    and self.failure is None
                    and (
                        self._pending is _NOTHING
                        or time.monotonic() < self._last_write + self.interval
                    )
                ):
                    if self._pending is _NOTHING:
                        self._cond.wait()
                    else:
                        self._cond.wait(self._last_write + self.interval - time.monotonic())
                if self._stopping or self.failure is not None:
                    return
                value, self._pending = self._pending, _NOTHING
            self._write(value, background=True)

    def _write(self, value: Any, *, background: bool) -> None:
        try:
            self._commit(value)
            self.commits += 1
        except LeaseLost as exc:
            self.fail(exc)
            if not background:
                raise
        except StoreError as exc:
            if not background:
                raise
            log.warning(f"checkpoint failed, will retry: {exc.message}")
            with self._cond:  # keep the newest: put ours back unless a newer one came
                if self._pending is _NOTHING:
                    self._pending = value
        finally:
            self._last_write = time.monotonic()

    def _stop_thread(self, timeout: float | None = None) -> None:
        with signals.HELD, self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    def finish(self) -> bool:
        """Write the newest uncommitted state now; return whether anything was written."""
        self._stop_thread()
        self.check()
        with signals.HELD, self._cond:
            value, self._pending = self._pending, _NOTHING
        if value is _NOTHING:
            return False
        self._write(value, background=False)
        return True

    def abandon(self, timeout: float | None = None) -> None:
        """Stop without writing what has not been committed yet.

        A write still waiting on the store is not waited for longer than ``timeout``:
        it is fenced (conditional on versions) and may be left to fail on its own.
        """
        with signals.HELD, self._cond:
            self._pending = _NOTHING
        self._stop_thread(timeout)
