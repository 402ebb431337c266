"""Holding the lease: renewals by compare-and-swap, and the heartbeat that makes them.

A renewal replaces our record, at the version the store last gave it, by one expiring a
TTL from now; a refusal means someone broke or took over the lease, and the run has lost
it. The heartbeat thread (the only thread a run starts in ``core``) renews every third
of the TTL. Each renewal carries a deadline, the lease's expiry minus
:func:`skew_allowance` (:mod:`mapper_state.stores.deadline`): the store call ends by then
whatever the store does, and a renewal that has not succeeded by then declares the lease
lost at that moment, so a store that stops answering cannot keep a run working past its
lease. Between renewals the heartbeat does the run's :class:`Chore` (its checkpoints),
whose store calls end by the same deadline: no state write outlives the lease it was
made under, and a renewal that is due goes before it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from mapper_state.core.lease.record import LeaseRecord, lost_to, read_lease, skew_allowance
from mapper_state.core.lease.settle import Settling
from mapper_state.errors import LeaseLost
from mapper_state.stores import deadline
from mapper_state.stores.base import PreconditionFailed, StoreError

OnLost = Callable[[LeaseLost], None]


class Chore(Protocol):
    """Work the heartbeat thread does between renewals (a run's checkpoints), so that a
    run starts one thread, not two. A renewal that is due always goes first."""

    def due_in(self) -> float | None:
        """Seconds until the chore is due (zero or less: now); ``None``: nothing to do."""

    def run(self) -> None:
        """Do it (in the heartbeat thread); :class:`LeaseLost` ends the heartbeat."""


class Holding(Settling):
    """``renew`` (and ``confirm``), ``adopt``/``disown``, and the heartbeat."""

    def renew(self) -> None:
        """Extend the lease by a compare-and-swap; :class:`LeaseLost` if it is no longer ours."""
        record = self.record
        # until the lease expires, or the renewal's deadline passes, whichever is first
        wait = deadline.seconds_left(record.expires_at - self.clock()) if record else 0.0
        if not self._lock.acquire(timeout=max(0.0, wait)):  # a renewal waiting on the store
            raise LeaseLost(
                f"lost the lease on {self.state_id}: could not renew it before it expired"
            )
        try:
            if self.lost:
                raise self.lost
            if self.record is None or self.version is None:
                raise LeaseLost(f"the lease on {self.state_id} is not held")
            now = self.clock()
            record = replace(self.record, renewed_at=now, expires_at=now + self.ttl)
            try:
                self.version = self.store.replace(self.key, record.to_bytes(), self.version)
            except PreconditionFailed:
                self._refused(record)
            except StoreError as exc:
                self._renewal_landed(exc, record)
            self.record = record
            self._renew_at = now + self.ttl / 3  # a confirmation is a renewal too
        finally:
            self._lock.release()

    #: Fencing: every state write is preceded by a confirmation of the lease, and confirming
    #: *is* renewing. A compare-and-swap on the version this run last wrote succeeds only if
    #: nobody broke or took over the lease since, so a run that lost its lease learns it
    #: before it writes (a plain read could not tell a lease that is ours from one that was
    #: ours a moment ago), and the lease is then good for a whole TTL after the check.
    confirm = renew

    def _refused(self, record: LeaseRecord) -> None:
        """A renewal to ``record`` was refused: an earlier attempt of it landed, or the lease
        is lost (raised as :class:`LeaseLost`, and remembered)."""
        holder, blob = read_lease(self.store, self.state_id)
        if blob is not None and self._ours(holder) and blob.data == record.to_bytes():
            self.version = blob.version  # an earlier attempt of this renewal landed
            return
        self.lost = LeaseLost(
            f"lost the lease on {self.state_id}: now {lost_to(holder, self.run_id)}"
        )
        raise self.lost from None

    def adopt(self, record: LeaseRecord, version: str) -> None:
        """Hold the lease another process acquired and handed over: its record at ``version``."""
        self.record, self.version = record, version

    def disown(self) -> None:
        """Forget the lease, handed over to another process, so that nothing here releases it."""
        self.record, self.version = None, None

    # -- the heartbeat -------------------------------------------------------------
    def start_heartbeat(self, on_lost: OnLost | None = None, chore: Chore | None = None) -> None:
        """Renew every third of the TTL in a thread, and do ``chore`` there when it is due;
        call ``on_lost`` once if the lease is lost."""
        self._heartbeat = threading.Thread(
            target=self._beat, args=(on_lost, chore), name="lease-heartbeat", daemon=True
        )
        self._heartbeat.start()

    def wake(self) -> None:
        """Wake the heartbeat now: its chore has work (a state offered)."""
        self._wake.set()

    def _first_renewal(self) -> float | None:
        """When the heartbeat first renews (``None``: never, someone else renews)."""
        if self.record is None:
            return None
        # a lease adopted after its create's answer was lost is already some seconds old
        return min(self.clock() + self.ttl / 3, self.record.renewed_at + self.ttl / 3)

    def _beat(self, on_lost: OnLost | None, chore: Chore | None) -> None:
        """The heartbeat thread: renew (a renewal that is due goes first) and do the chore,
        until stopped or until the lease is lost."""
        first = self._first_renewal()
        renewing = first is not None
        self._renew_at = first if first is not None else float("inf")
        while self._sleep(self._pause(chore)):
            if renewing and self.record is None:
                return  # released meanwhile
            if self.clock() >= self._renew_at:  # never, when not renewing (infinity)
                going_on = self._beat_once(on_lost)
            elif chore is not None and (due := chore.due_in()) is not None and due <= 0.0:
                going_on = self._do_chore(chore, on_lost)
            else:
                continue
            if not going_on:
                return

    def _pause(self, chore: Chore | None) -> float:
        """Seconds until the next renewal or the chore is due, whichever is first."""
        pause = self._renew_at - self.clock()
        due = chore.due_in() if chore is not None else None
        return max(0.0, pause if due is None else min(pause, due))

    def _sleep(self, seconds: float) -> bool:
        """Wait ``seconds``, or until woken; ``False`` once the heartbeat is stopped."""
        self._wake.wait(min(seconds, threading.TIMEOUT_MAX))
        # cleared before the caller looks for work: a wake-up after this is not lost
        self._wake.clear()
        return not self._stop.is_set()

    def _beat_once(self, on_lost: OnLost | None) -> bool:
        """One renewal, which must end by the lease's expiry minus the skew allowance; whether
        the heartbeat goes on (``False``: stopped, or the lease lost)."""
        record = self.record
        if record is None:
            return False
        by = record.expires_at - skew_allowance(self.ttl)
        try:
            with deadline.within(by - self.clock()):
                self.renew()
        except LeaseLost as exc:
            self._lose(exc, on_lost)
            return False
        except StoreError:
            if self._stop.is_set():
                return False
            if self.clock() >= by:
                self._lose(
                    LeaseLost(
                        f"lost the lease on {self.state_id}: could not renew it before it "
                        "expired (the store did not answer in time)"
                    ),
                    on_lost,
                )
                return False
            # transient: try again soon, within the lease
            self._renew_at = self.clock() + min(self.ttl / 3, max(0.05, (by - self.clock()) / 3))
        except Exception as exc:  # noqa: BLE001 - any other failure loses the lease, named
            self._lose(
                LeaseLost(f"lost the lease on {self.state_id}: renewing it failed: {exc!r}"),
                on_lost,
            )
            return False
        return True

    def _do_chore(self, chore: Chore, on_lost: OnLost | None) -> bool:
        """Do the chore, its store calls ending by the lease's expiry minus the skew
        allowance (no write outlives the lease it was made under); whether the heartbeat
        goes on (``False`` when the chore found the lease lost)."""
        record = self.record
        try:
            if record is None:  # someone else renews (an enclosing run): no deadline of ours
                chore.run()
            else:
                with deadline.within(record.expires_at - skew_allowance(self.ttl) - self.clock()):
                    chore.run()
        except LeaseLost as exc:
            self._lose(exc, on_lost)
            return False
        return True

    def _lose(self, error: LeaseLost, on_lost: OnLost | None) -> None:
        """The lease is lost: remember it, tell ``on_lost`` once, end the heartbeat."""
        if self._stop.is_set():
            return  # released meanwhile: nobody to tell
        self.lost = self.lost or error
        if on_lost:
            on_lost(self.lost)
