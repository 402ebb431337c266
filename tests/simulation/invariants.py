"""The invariants, read from the store's true history rather than from what contenders believe.

1. **One writer**: every state write that lands was sent by the holder of record at that
   moment (a holder whose lease an operator broke with ``--force`` while it ran, declaring
   it dead, is exempt from 1 and 3 itself: the others are not) (the lease object names its owner token, held, or broken and not yet free) and
   lands before that record's expiry in true time, the holder's clock taken into account.
2. **No lost increment**: the counter in the state, in the order writes landed, never goes
   down (each holder increments the counter of the state it was handed).
3. **A holder that lost its lease stops**: data is passed on only while the contender's
   lease is valid in true time; and a contender whose lease was lost (taken over, broken,
   expired) ends within a TTL of that moment, whether or not more input comes.
4. **No lease outlives its holders**: once every contender has ended, the lease is free
   within TTL plus the skew allowance of the last one's end.
5. **No stranded lease**: a contender that ended by itself (not killed) leaves no held
   lease naming it (a write whose answer was lost was settled).

:class:`Monitor` raises :class:`Broken` naming the invariant and the moment: 1 to 3 as
each write lands and each record is passed on, the others when the schedule ends.
"""

from __future__ import annotations

import orjson

from mapper_state.core.lease import BROKEN, LeaseRecord, skew_allowance
from mapper_state.core.state import STATE_FILE
from tests.simulation.scheduler import EPOCH
from tests.simulation.store import Landed
from tests.simulation.world import World


class Broken(AssertionError):
    """An invariant does not hold."""

    def __init__(self, number: int, what: str) -> None:
        super().__init__(f"invariant {number} broken: {what}")
        self.number = number


def _record(data: bytes | None) -> LeaseRecord | None:
    return LeaseRecord.from_bytes(data) if data else None


def _writer_of(world: World, record: LeaseRecord) -> str | None:
    """The contender whose owner token the record carries."""
    token = record.owner_token
    return next((name for name, owner in world.owners.items() if owner == token), None)


def _true_until(world: World, record: LeaseRecord) -> float:
    """The true moment until which ``record`` keeps others out, read with its writer's clock."""
    writer = _writer_of(world, record)
    clock = world.contenders[writer].clock if writer in world.contenders else None
    until = (
        record.free_at
        if record.status == BROKEN and record.free_at is not None
        else record.expires_at
    )
    return clock.true_of_wall(until) if clock else until - EPOCH


def _valid_for(world: World, record: LeaseRecord | None, name: str, at: float) -> bool:
    if record is None or world.owners.get(name) != record.owner_token:
        return False
    live = record.held or (record.status == BROKEN and record.free_at is not None)
    return live and at <= _true_until(world, record)


class Monitor:
    """Checks 1 to 3 as each write lands and each record is passed on; the rest at the end."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.checks = 0
        self.lease: LeaseRecord | None = None
        self.last_n: int | None = None

    def landed(self, landed: Landed) -> None:
        world = self.world
        if landed.key.endswith("mapper-state.lease.json"):
            now = None if landed.op == "delete" else _record(landed.data)
            self._note_forced(landed.sender, self.lease, now)
            self.lease = now
            return
        if not landed.key.endswith(f"/{STATE_FILE}") or landed.op == "delete":
            return
        self.checks += 1
        lease = _record(landed.lease_then)
        forced = world.owners.get(landed.sender) in world.forced_live
        if not forced and (
            landed.sender not in world.contenders
            or not _valid_for(world, lease, landed.sender, landed.landed_at)
        ):
            raise Broken(
                1,
                f"a state write by {landed.sender} landed at {landed.landed_at:.3f} while the lease "
                f"was {lease.describe() if lease else 'absent'} (write #{landed.seq})",
            )
        self.checks += 1
        doc = orjson.loads(landed.data or b"{}")
        n = doc.get("completed", {}).get("singer_state", {}).get("n")
        if isinstance(n, int):
            if self.last_n is not None and n < self.last_n:
                raise Broken(
                    2,
                    f"the counter went from {self.last_n} to {n} at {landed.landed_at:.3f} "
                    f"({landed.sender})",
                )
            self.last_n = n

    def _note_forced(
        self, sender: str, before: LeaseRecord | None, now: LeaseRecord | None
    ) -> None:
        """An operator's ``lock break --force`` landing on the lease of a contender that was
        not killed: that holder gives up 1 and 3 from this moment (it is declared dead). Read
        from the write as it lands, not from what the operator saw when it started: the
        lease may change hands between the two."""
        world = self.world
        if sender in world.contenders or before is None or now is None:
            return
        if now.status != BROKEN or now.free_at is not None:
            return  # not a forced break
        owner = before.owner_token
        killed = any(world.owners.get(n) == owner and c.killed for n, c in world.contenders.items())
        if not killed:
            world.forced_live.add(owner)

    def passed(self, at: float, name: str) -> None:
        """3: a run holding its own lease passes data on only while that lease is valid in
        true time (it checks its renewal deadline per chunk, so even a process frozen past
        it stops before passing more); a command under exec's lease, whose holder is
        another process, passes none once it has learned the lease is lost."""
        self.checks += 1
        learned = self.world.events.learned_lost.get(name)
        if self.world.kinds.get(name) == "exec":
            if learned is not None and at > learned:
                raise Broken(
                    3,
                    f"{name} passed data on at {at:.3f}, after it learned at "
                    f"{learned:.3f} that its lease was lost",
                )
            return
        if self.world.owners.get(name) in self.world.forced_live:
            return  # an operator forced the break of this live holder: 3 given up
        if not _valid_for(self.world, self.lease, name, at):
            raise Broken(
                3,
                f"{name} passed data on at {at:.3f} while the lease was "
                f"{self.lease.describe() if self.lease else 'absent'}",
            )

    def end(self) -> None:
        check_end(self.world, self)


def _lease_at(world: World, at: float) -> LeaseRecord | None:
    """The lease object's record at true time ``at``."""
    record: LeaseRecord | None = None
    for landed in world.store.history:
        if landed.landed_at > at:
            break
        if landed.key.endswith("mapper-state.lease.json"):
            record = None if landed.op == "delete" else _record(landed.data)
    return record


def check_end(world: World, counter: Monitor) -> None:
    """The end-of-schedule invariants (3's ending, 4, 5), once every contender has ended."""
    ttl = world.plan.ttl
    ends = [c.ended_at for c in world.contenders.values() if c.ended_at is not None]
    last_end = max(ends, default=0.0)
    final = _lease_at(world, float("inf"))
    counter.checks += 1
    if final is not None and final.held:
        free_from = _true_until(world, final) + skew_allowance(ttl)
        if free_from > last_end + ttl + skew_allowance(ttl) + 0.001:
            raise Broken(
                4,
                f"the lease ({final.describe()}) is held until {free_from:.3f}, more than TTL plus "
                f"the skew allowance after the last contender ended ({last_end:.3f})",
            )
    for name, c in world.contenders.items():
        counter.checks += 1
        outcome = world.events.outcome.get(name, "")
        if c.killed or final is None or world.owners.get(name) != final.owner_token:
            continue
        said = " ".join([outcome, *world.events.said.get(name, [])])
        # left held only if it expires within the skew allowance anyway (writing to a store
        # that does not answer would keep the process past its lease), or where even the
        # read-back failed and the run said until when it may hold it
        left = _true_until(world, final) - (c.ended_at or 0)
        if (
            final.held
            and left > skew_allowance(ttl)
            and f"may be held by this run ({final.run_id})" not in said
        ):
            raise Broken(
                5, f"{name} ended ({outcome}) at {c.ended_at:.3f} leaving {final.describe()}"
            )
    _check_stopped(world, counter)
    _check_no_false_loss(world, counter, final)


#: What a run says when it gives its lease up at the renewal deadline (``LeaseLapsed``):
#: its renewals got no answer in time, it was frozen past it, or (a writer under an
#: enclosing run's lease) the lease it read was within the skew allowance of its expiry,
#: which is the moment its holder gives it up unless a renewal lands first.
GIVING_UP = ("could not renew it before it expired", "ran out while", "is about to expire")


def _check_no_false_loss(world: World, counter: Monitor, final: LeaseRecord | None) -> None:
    """5, the other half: a contender that concluded it lost its lease while nobody else
    touched it (the lease, or the state under it) and the store still shows it held,
    unexpired, learned wrong."""
    for name, c in world.contenders.items():
        outcome = world.events.outcome.get(name, "")
        if c.killed or not outcome.startswith("lease-lost") or c.ended_at is None:
            continue
        reason = world.events.lost_reason.get(name, outcome)
        if any(rule in reason for rule in GIVING_UP):
            continue  # the renewal deadline passed (no answer, or frozen): giving up is the rule
        if _state_written_by_another_under(world, name):
            continue  # someone did touch it: refusing to overwrite that state is the rule
        counter.checks += 1
        learned = world.events.learned_lost.get(name, c.ended_at)
        record = _lease_at(world, learned)
        if (
            _lost_at(world, name) is None
            and record is not None
            and record.held
            and world.owners.get(name) == record.owner_token
            and learned + skew_allowance(world.plan.ttl) < _true_until(world, record)
        ):
            raise Broken(
                5,
                f"{name} concluded at {learned:.3f} that it lost its lease ({outcome}) while "
                f"the store held it as its own: {record.describe()}",
            )


def _state_written_by_another_under(world: World, name: str) -> bool:
    """Did a state write of another contender land while the lease was ``name``'s? Only a
    holder whose lease an operator forced while it ran can do that (invariant 1 holds the
    rest): its write, sent under its own lease, landing after ``name`` took the lease over."""
    owner = world.owners.get(name)
    for landed in world.store.history:
        if landed.sender == name or not landed.key.endswith(f"/{STATE_FILE}"):
            continue
        lease = _record(landed.lease_then)
        if lease is not None and lease.owner_token == owner:
            return True
    return False


def _check_stopped(world: World, counter: Monitor) -> None:
    """3, the ending: a contender whose lease was lost ends within a TTL of the loss."""
    ttl = world.plan.ttl
    for name, c in world.contenders.items():
        if c.killed or c.ended_at is None or name not in world.owners:
            continue
        lost_at = _lost_at(world, name)
        if lost_at is None:
            continue
        counter.checks += 1
        # it notices by its renewal deadline at the latest (a TTL after its last renewal),
        # then stops and releases, the release's call bound by the store (a third of the TTL)
        if c.ended_at > lost_at + ttl + ttl / 3 + c.paused_extra(lost_at):
            raise Broken(
                3,
                f"{name} lost its lease at {lost_at:.3f} but ended only at {c.ended_at:.3f} "
                f"(TTL {ttl:g} s)",
            )


def _lost_at(world: World, name: str) -> float | None:
    """The first true moment a lease of ``name`` stopped being its own other than by its
    own release: taken over by another, or broken."""
    owner = world.owners.get(name)
    held = False
    for landed in world.store.history:
        if not landed.key.endswith("mapper-state.lease.json"):
            continue
        record = None if landed.op == "delete" else _record(landed.data)
        ours = record is not None and record.owner_token == owner
        if ours and record is not None and record.held:
            held = True
        elif held and landed.sender != name:
            return landed.landed_at  # someone else changed our lease: broken or taken over
        elif held:
            held = False  # released by us
    return None
