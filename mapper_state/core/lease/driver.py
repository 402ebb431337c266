"""The heartbeat's driver: the one object that holds a lease's mutable state.

:class:`Lease` keeps the current :class:`~mapper_state.core.lease.claim.Claim` (or none),
whether the lease is known to be lost, and the heartbeat thread: the only thread a run
starts in ``core``. Every step it takes is a function of
:mod:`mapper_state.core.lease.protocol`; this module decides only *when* to take them:

- the heartbeat renews every third of the TTL (:func:`protocol.renewal_interval`), and
  between renewals reads the lease every
  :func:`~mapper_state.core.lease.protocol.notice_seconds` so that a ``lock break`` or a
  takeover is noticed within seconds (a changed version is renewed at once, which settles
  whether the lease is still ours);
- each renewal carries a deadline, the lease's expiry minus :func:`skew_allowance`
  (:mod:`mapper_state.stores.deadline`): the store call ends by then whatever the store
  does, and a renewal that has not succeeded by then declares the lease lost at that
  moment, so a store that stops answering cannot keep a run working past its lease;
- between renewals the heartbeat does the run's :class:`Chore` (its checkpoints), whose
  store calls end by the same deadline: no state write outlives the lease it was made
  under, and a renewal that is due goes before it;
- renewals and the release talk to the store one at a time (a lock held across the call).

Time, sleeps, locks and the thread come from :mod:`mapper_state.runtime`, which the
deterministic simulation replaces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from mapper_state import log, runtime, signals
from mapper_state.core.lease import protocol
from mapper_state.core.lease.claim import Applicant, Claim
from mapper_state.core.lease.record import (
    LeaseRecord,
    LeaseTiming,
    current_command,
    lease_key,
    new_run_id,
    read_lease,
    skew_allowance,
)
from mapper_state.errors import LeaseBroken, LeaseBusy, LeaseLapsed, LeaseLost
from mapper_state.stores import deadline
from mapper_state.stores.base import BlobStore, StoreError

OnLost = Callable[[LeaseLost], None]


class Chore(Protocol):
    """Work the heartbeat thread does between renewals (a run's checkpoints), so that a
    run starts one thread, not two. A renewal that is due always goes first."""

    def due_in(self) -> float | None:
        """Seconds until the chore is due (zero or less: now); ``None``: nothing to do."""

    def run(self) -> None:
        """Do it (in the heartbeat thread); :class:`LeaseLost` ends the heartbeat."""


class Lease:
    """This process's hold on one state ID: ``with Lease(store, state_id, ttl=...):``."""

    def __init__(
        self,
        store: BlobStore,
        state_id: str,
        *,
        ttl: float,
        retry: float = 1.0,
        wait: float = 0.0,
        run_id: str | None = None,
        owner: str | None = None,
        command: str | None = None,
        secrets: Iterable[str] = (),
        clock: Callable[[], float] = runtime.now,
    ) -> None:
        self.store = store
        self.retry = retry
        self.wait = wait
        self.clock = clock
        run_id = run_id or new_run_id()
        self.applicant = Applicant(
            state_id=state_id,
            run_id=run_id,
            owner=owner or run_id,
            command=current_command(secrets) if command is None else command,
            ttl=ttl,
        )
        self.claim: Claim | None = None
        self.lost: LeaseLost | None = None
        #: The holder whose expired or broken lease we took over: it may still be writing.
        self.took_over: LeaseRecord | None = None
        #: Held while a renewal or a release talks to the store: one at a time.
        self._lock = runtime.lock()
        self._stopped = runtime.event()
        #: Set to wake the heartbeat before its pause ends (its chore has work, or stop).
        self._wake = runtime.event()
        self._heartbeat: runtime.Thread | None = None
        #: Why the last renewal failed, while the heartbeat retries it (``None``: it did not).
        self._renewal_failed: str | None = None
        #: When the heartbeat renews next, and reads the lease next (our clock).
        self._renew_at = 0.0
        self._notice_at = float("inf")

    @classmethod
    def for_settings(
        cls, store: BlobStore, state_id: str, settings: LeaseTiming, **kwargs: object
    ) -> Lease:
        """A lease with the TTL, poll interval and wait time the settings give."""
        kwargs.setdefault("secrets", settings.secrets())
        return cls(
            store,
            state_id,
            ttl=settings.lock_timeout,
            retry=settings.lock_retry,
            wait=settings.lock_wait,
            **kwargs,  # type: ignore[arg-type]
        )

    # -- what callers read -------------------------------------------------------------
    @property
    def state_id(self) -> str:
        return self.applicant.state_id

    @property
    def key(self) -> str:
        return lease_key(self.state_id)

    @property
    def run_id(self) -> str:
        return self.applicant.run_id

    @property
    def owner(self) -> str:
        return self.applicant.owner

    @property
    def command(self) -> str:
        return self.applicant.command

    @property
    def ttl(self) -> float:
        return self.applicant.ttl

    @property
    def record(self) -> LeaseRecord | None:
        return self.claim.record if self.claim else None

    @property
    def version(self) -> str | None:
        return self.claim.version if self.claim else None

    # -- taking it ---------------------------------------------------------------------
    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lease, polling every ``retry`` seconds for up to ``wait`` seconds for a
        busy one; else :class:`LeaseBusy`, naming the holder. A stop signal ends the wait."""
        until = runtime.monotonic() + self.wait
        said = False
        while (holder := self.try_acquire()) is not None:
            if runtime.monotonic() + self.retry > until:
                waited = f" after waiting {self.wait:g}s" if self.wait else ""
                raise LeaseBusy(f"state ID {self.state_id} is busy{waited}: {holder.describe()}")
            if not said:
                log.info(
                    f"state ID {self.state_id} is busy, waiting up to {self.wait:g}s: "
                    f"{holder.describe()}"
                )
                said = True
            runtime.sleep(self.retry)

    def try_acquire(self) -> LeaseRecord | None:
        """Take the lease if free or expired; return the current holder's record if busy."""
        with signals.deferred():  # a lease we took is always one we remember
            got = protocol.try_acquire(self.store, self.applicant, self.clock)
            if isinstance(got, LeaseRecord):
                return got
            self._hold(got)
        return None

    def _hold(self, claim: Claim) -> None:
        self.claim, self.took_over, self.lost = claim, claim.took_over, None

    def adopt(self, record: LeaseRecord, version: str) -> None:
        """Hold the lease another process acquired and handed over: its record at ``version``."""
        self.claim = Claim(self.applicant, record, version)

    def disown(self) -> None:
        """Forget the lease, handed over to another process, so that nothing here releases it."""
        self.claim = None

    # -- holding it --------------------------------------------------------------------
    def renew(self) -> None:
        """Extend the lease by a compare-and-swap; :class:`LeaseLost` if it is no longer ours."""
        claim = self.claim
        # until the lease expires, or the renewal's deadline passes, whichever is first
        wait = deadline.seconds_left(claim.record.expires_at - self.clock()) if claim else 0.0
        if not self._lock.acquire(timeout=max(0.0, wait)):  # a renewal waiting on the store
            raise LeaseLapsed(
                f"lost the lease on {self.state_id}: could not renew it before it expired"
            )
        try:
            if self.lost:
                raise self.lost
            if self.claim is None:
                raise LeaseLost(f"the lease on {self.state_id} is not held")
            try:
                self.claim = protocol.renew(self.store, self.claim, self.clock)
            except LeaseLost as exc:
                self.lost = exc
                raise
            except protocol.NotRenewed as exc:
                self.claim = exc.claim
                raise
            # a confirmation is a renewal too
            self._renew_at = self.clock() + protocol.renewal_interval(self.ttl)
        finally:
            self._lock.release()

    def confirm(self) -> float:
        """Fencing, before every state write: confirming *is* renewing (``protocol.renew``).
        Returns the seconds the write that follows must end within: the renewed lease's
        expiry minus the skew allowance.

        A lease an operator broke stays this run's until its ``free_at`` (no other run may
        take it before): while the run winds down (its tap stopped, its target confirming
        what it loaded), a write is let through until the skew allowance before that.
        """
        lost = self.lost
        if isinstance(lost, LeaseBroken) and lost.free_at is not None and self.winding_down():
            return lost.free_at - skew_allowance(self.ttl) - self.clock()
        self.renew()
        return self._renewal_deadline() - self.clock()

    def lapsed(self) -> bool:
        """Has the renewal deadline of the lease held here passed (by this run's clock)?
        Cheap (no request): the pump asks once per chunk, so a process that was stopped or
        frozen past its lease passes nothing on before its heartbeat has caught up."""
        claim = self.claim
        return (
            claim is not None
            and self.clock() >= self._renewal_deadline()
            and not (self.winding_down())
        )

    def lapse(self) -> LeaseLost | None:
        """The loss, once the renewal deadline has passed (:meth:`lapsed`), remembered as lost
        so that the release only checks whether a late renewal landed; ``None`` while the
        lease holds. It says why: the store did not answer the renewals in time, or this
        process was not running (stopped or frozen) when they were due."""
        if not self.lapsed():
            return None
        why = (
            f"could not renew it before it expired ({self._renewal_failed})"
            if self._renewal_failed
            else "it ran out while this process was not running (stopped or frozen)"
        )
        self.lost = self.lost or LeaseLapsed(f"lost the lease on {self.state_id}: {why}")
        return self.lost

    def winding_down(self) -> bool:
        """Is the lease broken by an operator, and still ours to finish writing under?"""
        lost = self.lost
        return (
            isinstance(lost, LeaseBroken)
            and lost.free_at is not None
            and self.clock() < lost.free_at - skew_allowance(self.ttl)
        )

    # -- the heartbeat -----------------------------------------------------------------
    def start_heartbeat(self, on_lost: OnLost | None = None, chore: Chore | None = None) -> None:
        """Renew every third of the TTL in a thread, and do ``chore`` there when it is due;
        call ``on_lost`` once if the lease is lost. Without a lease held here (someone else
        renews it) the thread only does the chore."""
        self._heartbeat = runtime.thread(lambda: self._beat(on_lost, chore), "lease-heartbeat")
        self._heartbeat.start()

    def wake(self) -> None:
        """Wake the heartbeat now: its chore has work (a state offered)."""
        self._wake.set()

    def stop_heartbeat(self) -> None:
        """Stop renewing, and wait for the heartbeat thread (its renewal, or its chore, ends by
        its deadline)."""
        self._stopped.set()
        self._wake.set()
        if self._heartbeat and self._heartbeat is not runtime.current_thread():
            self._heartbeat.join()

    def _beat(self, on_lost: OnLost | None, chore: Chore | None) -> None:
        """The heartbeat thread: renew (a renewal that is due goes first), notice a changed
        lease, and do the chore, until stopped or until the lease is lost."""
        claim = self.claim
        renewing = claim is not None
        if claim is None:
            self._renew_at = float("inf")
        else:
            # a lease adopted after its create's answer was lost is already some seconds old
            now = self.clock()
            every = protocol.renewal_interval(self.ttl)
            self._renew_at = min(now, claim.record.renewed_at) + every
            self._notice_at = now + protocol.notice_seconds(self.ttl)
        while self._sleep(self._pause(chore)):
            if renewing and self.claim is None:
                return  # released meanwhile
            now = self.clock()
            if now >= self._renew_at:  # never, when not renewing (infinity)
                going_on = self._beat_once(on_lost)
            elif chore is not None and (due := chore.due_in()) is not None and due <= 0.0:
                going_on = self._do_chore(chore, on_lost)
            elif now >= self._notice_at:
                going_on = self._notice(on_lost)
            else:
                continue
            if not going_on:
                return

    def _pause(self, chore: Chore | None) -> float:
        """Seconds until the next renewal, read, or chore, whichever is first."""
        pause = min(self._renew_at, self._notice_at) - self.clock()
        due = chore.due_in() if chore is not None else None
        return max(0.0, pause if due is None else min(pause, due))

    def _sleep(self, seconds: float) -> bool:
        """Wait ``seconds``, or until woken; ``False`` once the heartbeat is stopped."""
        self._wake.wait(min(seconds, 1e9))
        # cleared before the caller looks for work: a wake-up after this is not lost
        self._wake.clear()
        return not self._stopped.is_set()

    def _renewal_deadline(self) -> float:
        """The moment a renewal must have succeeded by (our clock), else the lease is lost."""
        claim = self.claim
        return claim.record.expires_at - skew_allowance(self.ttl) if claim else 0.0

    def _beat_once(self, on_lost: OnLost | None) -> bool:
        """One renewal, which must end by the renewal deadline; whether the heartbeat goes
        on (``False``: stopped, or the lease lost)."""
        if self.claim is None:
            return False
        by = self._renewal_deadline()
        try:
            with deadline.within(by - self.clock()):
                self.renew()
        except LeaseLost as exc:
            self._lose(exc, on_lost)
            return False
        except StoreError as exc:
            self._renewal_failed = exc.message
            if self._stopped.is_set():
                return False
            if self.clock() >= by:
                self._lose(
                    LeaseLapsed(
                        f"lost the lease on {self.state_id}: could not renew it before it "
                        "expired (the store did not answer in time)"
                    ),
                    on_lost,
                )
                return False
            # transient: try again soon, within the lease
            self._renew_at = self.clock() + min(
                protocol.renewal_interval(self.ttl), max(0.05, (by - self.clock()) / 3)
            )
        except Exception as exc:  # noqa: BLE001 - any other failure loses the lease, named
            self._lose(
                LeaseLost(f"lost the lease on {self.state_id}: renewing it failed: {exc!r}"),
                on_lost,
            )
            return False
        self._renewal_failed = None
        self._notice_at = self.clock() + protocol.notice_seconds(self.ttl)
        return True

    def _notice(self, on_lost: OnLost | None) -> bool:
        """Read the lease between renewals: a version other than ours (a break, a takeover)
        is settled by renewing now. A failed read waits for the next renewal."""
        claim = self.claim
        self._notice_at = self.clock() + protocol.notice_seconds(self.ttl)
        if claim is None:
            return True
        try:
            with deadline.within(
                min(protocol.check_seconds(self.ttl), self._renewal_deadline() - self.clock())
            ):
                _, blob = read_lease(self.store, self.state_id)
        except StoreError:
            return True
        if blob is not None and blob.version == claim.version:
            return True
        return self._beat_once(on_lost)

    def _do_chore(self, chore: Chore, on_lost: OnLost | None) -> bool:
        """Do the chore, its store calls ending by the renewal deadline (no write outlives the
        lease it was made under); whether the heartbeat goes on (``False`` when the chore
        found the lease lost)."""
        try:
            if self.claim is None:  # someone else renews (an enclosing run): no deadline of ours
                chore.run()
            else:
                with deadline.within(self._renewal_deadline() - self.clock()):
                    chore.run()
        except LeaseLost as exc:
            self._lose(exc, on_lost)
            return False
        return True

    def _lose(self, error: LeaseLost, on_lost: OnLost | None) -> None:
        """The lease is lost: remember it, tell ``on_lost`` once, end the heartbeat."""
        if self._stopped.is_set():
            return  # released meanwhile: nobody to tell
        self.lost = self.lost or error
        if on_lost:
            on_lost(self.lost)

    # -- giving it up ------------------------------------------------------------------
    def release(self) -> None:
        """Give the lease up; a lease that is no longer ours is left alone.

        A holder that knows it lost its lease, or whose renewal deadline has passed, touches
        it only if the store shows it is still its own, or its own broken by an operator
        (``protocol.release_if_ours``, which checks within a quarter of the time left): the
        process is to end before its lease does.
        """
        self.stop_heartbeat()
        self.lapse()
        if self.lost is not None or not self._lock.acquire(timeout=self.ttl):
            claim, self.claim = self.claim, None
            if claim is not None:
                protocol.release_if_ours(self.store, claim, self.clock)
            return
        try:
            claim, self.claim = self.claim, None
            if claim is not None:
                protocol.release(self.store, claim, self.clock)
        finally:
            self._lock.release()
