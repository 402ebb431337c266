"""Broken variants of the protocol: what the simulation must catch, each within a stated
number of seeds.

Each variant patches one step of the production code the way a plausible mistake would
break it, for the schedules the simulation runs. ``tests/simulation/test_simulation.py``
runs each over its seeds and fails if none of them breaks an invariant: a simulation
that stops catching one has lost its teeth. The last two are bugs the simulation found
in the code of its day, kept broken here so that they stay caught (the others it found
are in docs/reliability.md, "The simulation").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from mapper_state.core import inherited, session
from mapper_state.core.lease import driver, protocol, record
from mapper_state.core.lease.claim import Applicant, Claim
from mapper_state.errors import LeaseLost
from mapper_state.stores.base import Blob, BlobStore, StoreError
from tests.simulation.world import Plan


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    #: How many seeds (0, 1, 2, ...) must hold at least one schedule that catches it.
    seeds: int
    patches: tuple[tuple[Any, str, Any], ...]
    #: What the schedules need to meet it (a kind of store, clocks at the edge).
    adjust: Callable[[Plan], Plan] = lambda plan: plan

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for owner, name, stand_in in self.patches:
                stack.callback(setattr, owner, name, getattr(owner, name))
                setattr(owner, name, stand_in)
            yield


def _confirm_nothing(self: Any) -> float:
    return 1e9


def _swallow_refusal(store: BlobStore, claim: Claim, rec: record.LeaseRecord) -> Claim:
    blob = store.read(claim.key)
    return claim.at(rec, blob.version if blob else claim.version)  # "renewed" whatever it found


def _take_over_blindly(
    store: BlobStore, me: Applicant, holder: record.LeaseRecord | None, blob: Blob, clock: Any
) -> Claim | None:
    """A takeover that reads the version again and writes on it: read-then-write, no CAS
    on what was judged expired."""
    fresh = me.fresh_record(clock())
    now = store.read(me.key)
    version = store.replace(me.key, fresh.to_bytes(), now.version if now else blob.version)
    return Claim(me, fresh, version, holder)


def _release_whatever(
    store: BlobStore, claim: Claim, clock: Any, failed: StoreError | None = None
) -> None:
    with contextlib.suppress(StoreError):
        store.delete(claim.key)  # without looking whose lease it is now


def _adopt_unread(
    store: BlobStore, me: Applicant, exc: StoreError, rec: record.LeaseRecord, what: str, clock: Any
) -> Claim:
    return Claim(me, rec, "unknown")  # assumed landed, never read back


def _old_refused(store: BlobStore, claim: Claim, rec: record.LeaseRecord) -> Claim:
    """The refusal rule before the simulation: only *this* renewal's bytes count as ours."""
    holder, blob = record.read_lease(store, claim.state_id)
    if blob is not None and record.is_held_by(holder, claim.owner) and blob.data == rec.to_bytes():
        return claim.at(rec, blob.version)
    raise LeaseLost(f"lost the lease on {claim.state_id}")


def _old_fresh(store: BlobStore, claim: Claim, clock: Callable[[], float]) -> Any:
    """A claim taken near its expiry before the simulation found it: renewed at once, but a
    renewal that got no answer escaped as a store error, the claim neither released nor
    its expiry said."""
    if clock() < claim.record.expires_at - record.skew_allowance(claim.ttl):
        return claim
    try:
        return protocol.renew(store, claim, clock)
    except LeaseLost:
        holder, _ = record.read_lease(store, claim.state_id)
        return holder or claim.record


def _no_skew(ttl: float) -> float:
    return 0.0


def _edge_clocks(plan: Plan) -> Plan:
    skew = record.skew_allowance(plan.ttl)
    for i, spec in enumerate(plan.contenders):
        spec["offset"] = skew * 0.98 * (1 if i % 2 else -1)
    return plan


def _paused_near_expiry(plan: Plan) -> Plan:
    """Contenders frozen for most of a TTL (so that they resume close to their lease's
    expiry), clocks at the edge of the allowance, takers waiting."""
    import random

    rng = random.Random(plan.seed)
    plan = _edge_clocks(plan)
    while len(plan.contenders) < 3:
        plan.contenders.append({**plan.contenders[-1], "name": f"c{len(plan.contenders)}"})
    for spec in plan.contenders:
        spec["wait"] = 4 * plan.ttl
        spec["kill_at"] = None
        spec["pause_at"] = round(rng.uniform(0, 2 * plan.ttl), 3)
        spec["pause_for"] = round(rng.uniform(0.4, 1.0) * plan.ttl, 3)
    return plan


def _failing_renewals(plan: Plan) -> Plan:
    return replace(_paused_near_expiry(plan), faults=replace(plan.faults, not_applied=0.1))


def _lost_answers(plan: Plan) -> Plan:
    return replace(plan, faults=replace(plan.faults, answer_lost=0.15, slow_answer=0.15))


def _quick_timeouts(plan: Plan) -> Plan:
    """A store that gives up on a call quickly (a tenth of the TTL: a reset, a store with a
    short bound of its own), so that a create whose answer was lost is settled well before
    the lease is due for renewal: nothing renews it before the run starts on it."""
    return replace(plan, call_seconds=plan.ttl / 10)


def _ignoring_deletes(plan: Plan) -> Plan:
    """A store that ignores delete conditions and takes its time (a release sent close to
    the lease's expiry lands after a takeover), contenders resuming close to expiry."""
    plan = _paused_near_expiry(plan)
    for spec in plan.contenders:
        spec["pause_rate"] = 0.05  # frozen at a step: between deciding to delete and sending
    faults = replace(plan.faults, delete_conditions="ignore", slow_answer=0.3)
    return replace(plan, faults=faults)


def _unchecked_session(self: session.Session) -> None:
    assert self.checkpointer is not None
    self.checkpointer.check()


def _all_run(plan: Plan) -> Plan:
    for spec in plan.contenders:
        spec["kind"] = "run"
    return plan


VARIANTS: tuple[Variant, ...] = (
    Variant(
        "no-confirm",
        "no lease confirmation before a state write",
        200,
        (
            (driver.Lease, "confirm", _confirm_nothing),
            (inherited.InheritedLease, "confirm", _confirm_nothing),
        ),
    ),
    Variant(
        "renewal-swallows-loss",
        "a renewal that swallows a lost lease",
        200,
        ((protocol, "_refused", _swallow_refusal),),
    ),
    Variant(
        "takeover-without-cas",
        "a takeover without compare-and-swap",
        800,
        ((protocol, "_take_over", _take_over_blindly),),
    ),
    Variant(
        "release-not-ours",
        "a release that deletes without checking the record is ours",
        600,
        ((protocol, "release_if_ours", _release_whatever),),
    ),
    Variant(
        "adopt-unread",
        "an answer-lost create adopted without reading back",
        200,
        ((protocol, "_settle_unknown", _adopt_unread),),
        _quick_timeouts,
    ),
    Variant(
        "no-skew-allowance",
        "the skew allowance set to 0 with skewed clocks",
        400,
        (
            (record, "skew_allowance", _no_skew),
            (driver, "skew_allowance", _no_skew),
            (protocol, "skew_allowance", _no_skew),
            (inherited, "skew_allowance", _no_skew),
        ),
        _failing_renewals,
    ),
    Variant(
        "trust-ignored-delete",
        "trusting a conditional delete on a store that ignores it",
        2000,
        ((protocol, "releases_by_delete", lambda store: True),),
        _ignoring_deletes,
    ),
    Variant(
        "found-unseen-renewal-lost",
        "found by the simulation: a renewal refused after an earlier one landed unseen "
        "called the lease lost (and left it held)",
        200,
        ((protocol, "_refused", _old_refused),),
        _lost_answers,
    ),
    Variant(
        "found-frozen-run-passes-data",
        "found by the simulation: a run frozen past its lease passed data on before its "
        "heartbeat caught up",
        100,
        ((session.Session, "check", _unchecked_session),),
        _all_run,
    ),
)


def _frozen_at_store_calls(plan: Plan) -> Plan:
    """The ignoring store's world, with processes frozen at one store call in seven."""
    plan = _ignoring_deletes(plan)
    for spec in plan.contenders:
        spec["pause_rate"] = 0.15
    return plan


#: Bugs the simulation found in a world too rare to scan for (one seed in several hundred
#: meets it): each variant, kept broken, with the seed whose world breaks it; the suite
#: replays that seed and fails if the variant is no longer caught there, or the real code is.
FOUND_AT_SEED: tuple[tuple[Variant, int], ...] = (
    (
        Variant(
            "found-fresh-renewal-strands",
            "found by the simulation: a lease taken by a process frozen near its expiry, whose "
            "renewal at once got no answer, was left held (no release, no expiry said)",
            1,
            ((protocol, "_fresh", _old_fresh),),
            _frozen_at_store_calls,
        ),
        736,
    ),
)
