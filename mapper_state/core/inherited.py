"""A lease held by an enclosing run (``mapper-state exec``), as the processes inside it see it.

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
)
from mapper_state.errors import LeaseLost
from mapper_state.stores.base import BlobStore

#: The environment variable naming the leases an enclosing ``exec`` holds (a JSON list).
HELD_LEASE_VAR = "MAPPER_STATE_HELD_LEASE"
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
    #: The owner token the lease record carries (empty: the run ID is the token).
    owner: str = ""


def held_leases(env: Mapping[str, str] | None = None) -> list[HeldLease]:
    """The leases the environment says an enclosing run holds (none when unreadable)."""
    raw = (os.environ if env is None else env).get(HELD_LEASE_VAR, "")
    try:
        items = json.loads(raw) if raw else []
        return [
            HeldLease(
                str(i["state_id"]), str(i["run_id"]), str(i["store"]), str(i.get("owner") or "")
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


def is_this_run(holder: LeaseRecord | None, owner: str, now: float) -> bool:
    """Is ``holder`` the lease of the run whose owner token is ``owner``, held, and not
    within the skew allowance of its expiry (where the holder itself would call it lost)?"""
    return is_held_by(holder, owner, now)


class InheritedLease(Lease):
    """The enclosing run's lease, used by a process inside it: confirmed, never renewed here.

    It keeps :class:`Lease`'s surface (``acquire``, ``confirm``, heartbeat, ``release``,
    ``run_id``, ``command``) so that every caller uses it as it uses its own lease;
    ``record`` stays ``None``, so nothing hands it over or rewrites it.
    """

    def confirm(self) -> None:
        """Fencing: :class:`LeaseLost` unless the lease is still the enclosing run's."""
        holder, _ = read_lease(self.store, self.state_id)
        if is_this_run(holder, self.owner or self.run_id, self.clock()):
            return
        ours = is_held_by(holder, self.owner or self.run_id)
        now = "about to expire" if ours else f"gone: now {lost_to(holder, self.run_id)}"
        raise LeaseLost(
            f"the lease on {self.state_id} of the enclosing run {self.run_id} "
            f"(mapper-state exec) is {now}; not writing"
        )

    renew = confirm

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
            super().start_heartbeat(on_lost, chore)

    def release(self) -> None:
        """The enclosing run releases the lease."""


def lease_for(
    store: BlobStore,
    state_id: str,
    settings: LeaseTiming,
    env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> Lease:
    """The lease a writer of ``state_id`` works under: the enclosing run's if the environment
    names one on this state ID in this store, else a lease of its own (``Lease.for_settings``)."""
    held = held_here(store, state_id, env)
    kwargs.setdefault("owner", (os.environ if env is None else env).get(OWNER_VAR, ""))
    if held is None:
        return Lease.for_settings(store, state_id, settings, **kwargs)
    kwargs["run_id"] = held.run_id
    kwargs["owner"] = held.owner  # the token its record carries ("": its run ID)
    return InheritedLease.for_settings(store, state_id, settings, **kwargs)
