"""A lease held by an enclosing run (``mapper-state exec``, a Meltano run), as the processes inside it see it.

``mapper-state exec`` holds the lease on a state ID for the whole life of a command and
names it in the command's environment (:data:`HELD_LEASE_VAR`: the state ID, the run ID
and the store). A mapper-state inside that command (the filter, ``run``, ``state set``,
the Meltano add-on) that works on the same state ID in the same store must not take a
second lease: it would wait for its own run, or be refused as busy. It writes under the
enclosing run's lease instead, fenced: before each write it reads the lease record and
goes on only while the record is still that run's, held and not about to expire; else
the write is refused with :class:`~mapper_state.errors.LeaseLost`. The enclosing run
renews and releases the lease, so here the heartbeat renews nothing (it only does a run's
checkpoints) and release does nothing.

Callers build their lease with :func:`lease_for` instead of ``Lease.for_settings``: the
same lease surface either way, one call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from mapper_state.core.lease import (
    Chore,
    Lease,
    LeaseRecord,
    LeaseTiming,
    is_held_by,
    lost_to,
    read_lease,
    skew_allowance,
    winding_down_for,
)
from mapper_state.errors import LeaseLapsed, LeaseLost
from mapper_state.stores.base import BlobStore

#: The environment variable naming the leases an enclosing run holds (a JSON list).
HELD_LEASE_VAR = "MAPPER_STATE_HELD_LEASE"
#: Who holds an inherited lease, as messages name it.
EXEC = "mapper-state exec"
MELTANO_RUN = "the Meltano run"

#: The owner token of the enclosing run (a Meltano process sets it for the plugins it
#: starts): every lease a process inside it takes carries it as the record's ``owner``, so
#: that the run recognises its own leases (:func:`~mapper_state.core.lease.is_held_by`).
OWNER_VAR = "MAPPER_STATE_RUN_OWNER"


@dataclass(frozen=True)
class HeldLease:
    """A lease an enclosing run holds: which state ID, which run, in which store."""

    state_id: str
    run_id: str
    #: The store's ``display_uri`` (no secret in it).
    store: str
    #: Who holds it (:data:`EXEC`, :data:`MELTANO_RUN`); empty when not said.
    holder: str = ""
    #: The owner token the lease record carries (empty: the run ID).
    owner: str = ""

    @property
    def winds_down(self) -> bool:
        """Does the enclosing run wind down when an operator breaks its lease, keeping the
        state its loader confirms (a Meltano run: its extractor stopped first), rather than
        stop at once (``exec``, which cannot tell its command's steps apart)? Writes under
        the broken lease are let through while it winds down, refused otherwise."""
        return self.holder == MELTANO_RUN

    def described(self) -> str:
        """The enclosing run as messages name it: ``run 1a2b (mapper-state exec)``."""
        return f"run {self.run_id}" + (f" ({self.holder})" if self.holder else "")


def held_leases(env: Mapping[str, str] | None = None) -> list[HeldLease]:
    """The leases the environment says an enclosing run holds (none when unreadable)."""
    raw = (os.environ if env is None else env).get(HELD_LEASE_VAR, "")
    try:
        items = json.loads(raw) if raw else []
        return [
            HeldLease(
                str(i["state_id"]),
                str(i["run_id"]),
                str(i["store"]),
                str(i.get("holder") or ""),
                str(i.get("owner") or ""),
            )
            for i in items
        ]
    except (ValueError, TypeError, KeyError):
        return []


def with_held(held: HeldLease, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment (``os.environ`` by default) that also names ``held``."""
    env = dict(os.environ if env is None else env)
    leases = [h for h in held_leases(env) if (h.state_id, h.store) != (held.state_id, held.store)]
    env[HELD_LEASE_VAR] = json.dumps([asdict(h) for h in (*leases, held)])
    return env


def held_here(
    store: BlobStore, state_id: str, env: Mapping[str, str] | None = None
) -> HeldLease | None:
    """The enclosing run's lease on ``state_id`` in ``store``, if the environment names one."""
    where = store.display_uri
    return next((h for h in held_leases(env) if h.state_id == state_id and h.store == where), None)


class InheritedLease:
    """The enclosing run's lease, used by a process inside it: confirmed, never renewed here.

    It has :class:`Lease`'s surface (``acquire``, ``confirm``, heartbeat, ``release``,
    ``run_id``, ``command``) so that every caller uses it as it uses its own lease;
    ``record`` is ``None``, so nothing hands it over or rewrites it. Its heartbeat, when a
    run has checkpoints, is a :class:`Lease` holding nothing, which only does the chore.
    """

    record: LeaseRecord | None = None
    version: str | None = None
    took_over: LeaseRecord | None = None
    lost: LeaseLost | None = None

    def __init__(self, store: BlobStore, state_id: str, held: HeldLease, **kwargs: Any) -> None:
        self.store = store
        self.state_id = state_id
        self.held = held
        self._chores = Lease(store, state_id, run_id=held.run_id, **kwargs)
        self.run_id = held.run_id
        self.owner = held.owner or held.run_id
        self.command = self._chores.command
        self.clock = self._chores.clock
        self.retry = self._chores.retry
        self.ttl = self._chores.ttl
        self.wait = self._chores.wait

    @classmethod
    def for_settings(
        cls, store: BlobStore, state_id: str, held: HeldLease, settings: LeaseTiming, **kwargs: Any
    ) -> InheritedLease:
        kwargs.setdefault("secrets", settings.secrets())
        return cls(store, state_id, held, ttl=settings.lock_timeout, **kwargs)

    def confirm(self) -> float:
        """Fencing: :class:`LeaseLost` unless the lease is still the enclosing run's; the
        seconds the write that follows must end within (its expiry minus the skew
        allowance, which the enclosing run moves on as it renews). A lease an operator
        broke is still the run's while it winds down, if it winds down
        (:attr:`HeldLease.winds_down`, :func:`winding_down_for`)."""
        holder, _ = read_lease(self.store, self.state_id)
        now = self.clock()
        if holder is not None and is_held_by(holder, self.owner, now):
            return holder.expires_at - skew_allowance(holder.ttl_seconds) - now
        if self.held.winds_down and (left := winding_down_for(holder, self.owner, now)):
            return left  # broken by an operator: the run winds down, as its holder lets it
        ours = is_held_by(holder, self.owner)
        state = "about to expire" if ours else f"gone: now {lost_to(holder, self.run_id)}"
        raise (LeaseLapsed if ours else LeaseLost)(
            f"the lease on {self.state_id} in {self.store.display_uri} of the enclosing "
            f"{self.held.described()} is {state}; not writing"
        )

    def renew(self) -> None:
        """The enclosing run renews the lease: here, only confirmed."""
        self.confirm()

    def try_acquire(self) -> LeaseRecord | None:
        self.confirm()
        return None

    def acquire(self) -> None:
        self.confirm()

    def start_heartbeat(
        self, on_lost: Callable[[LeaseLost], None] | None = None, chore: Chore | None = None
    ) -> None:
        """The enclosing run renews the lease: a heartbeat starts only to do ``chore``."""
        if chore is not None:
            self._chores.start_heartbeat(on_lost, chore)

    def wake(self) -> None:
        self._chores.wake()

    def lapse(self) -> LeaseLost | None:
        """The enclosing run renews the lease and knows when it lapses (it stops us then)."""
        return None

    def stop_heartbeat(self) -> None:
        self._chores.stop_heartbeat()

    def release(self) -> None:
        """The enclosing run releases the lease."""
        self.stop_heartbeat()

    def __enter__(self) -> InheritedLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


#: The lease a writer works under: its own, or the enclosing run's.
AnyLease = Lease | InheritedLease


def lease_for(
    store: BlobStore,
    state_id: str,
    settings: LeaseTiming,
    env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> AnyLease:
    """The lease a writer of ``state_id`` works under: the enclosing run's if the environment
    names one on this state ID in this store, else a lease of its own (``Lease.for_settings``)."""
    held = held_here(store, state_id, env)
    kwargs.setdefault("owner", (os.environ if env is None else env).get(OWNER_VAR, ""))
    if held is None:
        return Lease.for_settings(store, state_id, settings, **kwargs)
    return InheritedLease.for_settings(store, state_id, held, settings, **kwargs)
