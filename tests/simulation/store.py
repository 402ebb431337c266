"""The simulated store: the store interface over a dict, keeping the true order of writes.

Every call is a step where the caller may be overtaken; then the network and the store
do what the seed says:

- most calls are applied and answered after a short latency;
- **answer lost**: applied, but the caller's call fails with a timeout (a reset);
- **not applied**: the call times out and nothing was applied;
- **slow answer**: applied at any moment up to the caller's deadline (a store that takes
  its time), the answer arriving after it, so the caller gives up at its deadline (a
  timeout): it cannot tell it from a loss, and the write may land after later ones it sent;
- a call whose deadline has passed is refused before anything is sent (the rule every
  store keeps, :mod:`mapper_state.stores.deadline`).

Applying happens in the scheduler, at a true moment chosen within the call, so a request
already sent lands even if its sender is paused or killed meanwhile. Two kinds of store
are simulated besides the plain one: one that accepts a delete's condition and ignores it
(Ceph RGW, fake-gcs-server, MinIO), and one that refuses it as not implemented (the 501
class). Each landed write is appended to :attr:`SimStore.history` with who sent it, when
it was sent and when it landed: the invariants read the truth from there.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mapper_state.stores import deadline
from mapper_state.stores.base import (
    Blob,
    ConditionNotSupported,
    Entry,
    PreconditionFailed,
    StoreError,
    StoreTraits,
)
from tests.simulation.scheduler import Contender, Killed, Sim


@dataclass(frozen=True)
class Landed:
    """One write the store applied, in the true order."""

    seq: int
    sent_at: float
    landed_at: float
    sender: str
    op: str  # create | replace | delete
    key: str
    data: bytes | None
    version: str | None
    #: The lease object's record (bytes) at the moment this landed.
    lease_then: bytes | None


@dataclass
class Faults:
    """How often each fault is chosen, per call (0 to 1), and what kind of store it is."""

    answer_lost: float = 0.0
    not_applied: float = 0.0
    slow_answer: float = 0.0
    #: "enforce" | "ignore" (the RGW class) | "refuse" (the 501 class)
    delete_conditions: str = "enforce"


class SimStore:
    """``BlobStore`` for the simulation (see the module)."""

    display_uri = "sim://store"

    def __init__(self, sim: Sim, faults: Faults, lease_key: str, call_seconds: float) -> None:
        self.sim = sim
        #: What a call may spend when no deadline is set: the store's own bound (the opener
        #: sets a third of the lease TTL, ``retry_deadline_seconds``).
        self.call_seconds = call_seconds
        self.faults = faults
        self.lease_key = lease_key
        self._objects: dict[str, Blob] = {}
        self._versions = itertools.count(1)
        self.history: list[Landed] = []
        #: Called as each write lands (the invariants' monitor).
        self.on_landed: Callable[[Landed], None] = lambda landed: None
        self.injected: dict[str, int] = {}
        self.traits = StoreTraits(
            enforces_delete_conditions=faults.delete_conditions == "enforce",
        )

    def close(self) -> None:
        pass

    # -- the interface ---------------------------------------------------------------
    def read(self, key: str) -> Blob | None:
        found: Blob | None = self._call("read", key, lambda: self._objects.get(key))
        return found

    def create(self, key: str, data: bytes) -> str:
        def apply() -> str:
            if key in self._objects:
                raise PreconditionFailed(f"{key} exists")
            return self._put("create", key, data, sent)

        sent = self.sim.now
        version: str = self._call("create", key, apply)
        return version

    def replace(self, key: str, data: bytes, if_version: str) -> str:
        def apply() -> str:
            current = self._objects.get(key)
            if current is None or current.version != if_version:
                raise PreconditionFailed(f"{key} changed since {if_version}")
            return self._put("replace", key, data, sent)

        sent = self.sim.now
        version: str = self._call("replace", key, apply)
        return version

    def delete(self, key: str, if_version: str | None = None) -> None:
        mode = self.faults.delete_conditions
        if if_version is not None and mode == "refuse":
            self._call("delete", key, lambda: None)
            self.traits.learned.refuses_delete_conditions.learn()
            raise ConditionNotSupported(
                f"{self.display_uri}/{key}: delete with a condition not implemented"
            )

        def apply() -> None:
            current = self._objects.get(key)
            moved = current is None or current.version != if_version
            if if_version is not None and mode == "enforce" and moved:
                raise PreconditionFailed(f"{key} changed since {if_version}")
            if current is not None:
                self._record("delete", key, None, None, sent)
                del self._objects[key]

        sent = self.sim.now
        self._call("delete", key, apply)

    def list(self, prefix: str = "") -> Iterator[str]:
        for entry in self.list_entries(prefix):
            yield entry.key

    def list_entries(self, prefix: str = "", exclude: str | None = None) -> Iterator[Entry]:
        keys = self._call("list", prefix, lambda: sorted(self._objects))
        yield from (
            Entry(k, None)
            for k in keys
            if k.startswith(prefix) and not (exclude and k.startswith(exclude))
        )

    # -- the network -------------------------------------------------------------------
    def _call(self, op: str, key: str, apply: Any) -> Any:
        sim = self.sim
        sim.step()  # another process may go first
        me = sim.current_contender()
        deadline.check(f"{op} {self.display_uri}/{key}")
        left = deadline.seconds_left(self.call_seconds)
        limit = sim.later(left)  # the true moment the caller gives up
        latency = sim.rng.uniform(0.001, 0.05)
        fault = self._fault(op)
        if fault == "not_applied" or (fault is None and sim.now + latency > limit):
            self._count(fault or "timed_out")
            sim.block(None, limit)
            raise StoreError(f"{op} {self.display_uri}/{key}: timed out")
        outcome: list[Any] = []
        # a slow answer: the store took its time, anywhere up to the caller's deadline
        within = (
            max(0.0, limit - sim.now) if fault == "slow_answer" else min(latency, limit - sim.now)
        )
        land_at = sim.now + sim.rng.uniform(0.0, max(0.0, within))

        def land() -> None:
            self._landing_for = me.name if me else "world"
            try:
                outcome.append(("ok", apply()))
            except PreconditionFailed as exc:
                outcome.append(("refused", exc))
            finally:
                self._landing_for = None
            if fault is not None:
                self._trace(me, f"{op} {key} landed, its answer {fault.replace('_', ' ')}")

        sim.at(land_at, land)
        if fault is not None:  # answer lost, or arriving after the caller has given up
            self._count(fault)
            sim.block(None, limit)
            raise StoreError(f"{op} {self.display_uri}/{key}: timed out (answer lost)")
        sim.block(None, sim.now + latency)  # the answer comes back; it landed before
        status, value = outcome[0]
        self._trace(me, f"{op} {key}: {status}")
        if status == "refused":
            raise value
        return value

    def _fault(self, op: str) -> str | None:
        if op in ("read", "list") and self.sim.rng.random() < 0.5:
            return None  # reads fail less often: half the rate
        roll = self.sim.rng.random()
        for name in ("answer_lost", "not_applied", "slow_answer"):
            rate = getattr(self.faults, name)
            if roll < rate:
                return name
            roll -= rate
        return None

    def _count(self, fault: str) -> None:
        self.injected[fault] = self.injected.get(fault, 0) + 1

    def _trace(self, me: Contender | None, what: str) -> None:
        if me is not None and me.killed:
            return
        self.sim.log(what)

    # -- the truth ---------------------------------------------------------------------
    def _put(self, op: str, key: str, data: bytes, sent: float) -> str:
        version = str(next(self._versions))
        self._record(op, key, data, version, sent)
        self._objects[key] = Blob(bytes(data), version)
        return version

    def _record(
        self, op: str, key: str, data: bytes | None, version: str | None, sent: float
    ) -> None:
        sender = self.sim.current_contender()
        lease = self._objects.get(self.lease_key)
        self.history.append(
            Landed(
                seq=len(self.history),
                sent_at=sent,
                landed_at=self.sim.now,
                sender=self._sender_name(sender),
                op=op,
                key=key,
                data=data,
                version=version,
                lease_then=lease.data if lease else None,
            )
        )
        self.on_landed(self.history[-1])

    def _sender_name(self, sender: Contender | None) -> str:
        return self._landing_for or (sender.name if sender else "world")

    _landing_for: str | None = None

    def objects(self) -> dict[str, Blob]:
        return dict(self._objects)

    def raise_if_killed(self) -> None:
        who = self.sim.current_contender()
        if who is not None and who.killed:
            raise Killed
