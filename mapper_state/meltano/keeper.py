"""Holding a Meltano run's lease until Meltano has written its final state.

Inside ``meltano run`` the mapper exits when the tap's stream ends, but the target
may still be loading, and Meltano writes the state it confirms only afterwards. A
lease released at the mapper's exit would let another run start from the old
state. So after a successful mapping run the lease is handed to a small detached
keeper process (same run ID, renewed by compare-and-swap like any holder) that
releases it once Meltano's process is gone; if the keeper dies, the lease expires
after its TTL like any crashed holder's.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from mapper_state import log, runtime
from mapper_state.config import settings_from_values
from mapper_state.core import history, state
from mapper_state.core.lease import Lease, LeaseRecord
from mapper_state.errors import LeaseLost, MapperStateError
from mapper_state.meltano import env as meltano
from mapper_state.settings import Settings
from mapper_state.stores import open_configured_store
from mapper_state.stores.base import BlobStore

KEEP_LEASE_ARG = "keep-lease"


def kept_for(parent: int) -> str:
    """How a keeper's lease record's command begins (for an operator reading ``lock status``;
    the run is recognised by the record's ``owner``, never by this)."""
    return f"lease kept until Meltano pid {parent} exits, for: "


def hand_over_lease(
    lease: Lease,
    settings: Settings,
    env: Mapping[str, str] | None = None,
    *,
    snapshot: bool = False,
) -> bool:
    """After a successful mapping run, keep the lease until Meltano (our parent) exits.

    The mapper exits when the tap's stream ends, but the target may still be loading
    and Meltano writes the state it confirms only afterwards: a lease released at the
    mapper's exit would let another run start from the old state. A small detached
    process takes the lease over (same run ID, renewed by compare-and-swap like any
    holder) and releases it once Meltano's process is gone. With ``snapshot`` (the
    state is Meltano's to write) it first keeps a history snapshot of the state Meltano
    wrote, so that ``state rollback`` can undo a bad run or a ``meltano state clear``.
    Returns False when there is nothing to hand over or no keeper could be started; the
    caller then releases.
    """
    run = meltano.MeltanoRun.from_env(env)
    parent = os.getppid()
    if run is None or parent <= 1 or lease.record is None or lease.version is None:
        return False
    try:
        keeper_pid = _spawn_keeper(lease, settings, parent, snapshot=snapshot)
    except (MapperStateError, OSError) as exc:
        message = exc.message if isinstance(exc, MapperStateError) else str(exc)
        log.warning(f"could not keep the lease until Meltano exits: {message}")
        return False
    lease.disown()  # the keeper's now: nothing here may release it
    log.info(
        f"keeping the lease on {lease.state_id} until Meltano (pid {parent}) has written "
        "its state and exited",
        keeper_pid=keeper_pid,
    )
    return True


def _open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits, where the system has them."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _handover(
    lease: Lease, settings: Settings, parent: int, pidfd: int | None, snapshot: bool
) -> dict[str, Any]:
    """What the keeper reads on its stdin: the settings and the lease as held right now."""
    record, version = lease.record, lease.version
    if record is None or version is None:  # renew() raises rather than leave it so
        raise LeaseLost(f"the lease on {lease.state_id} is not held")
    return {
        "settings": dict(settings.values),
        "state_id": lease.state_id,
        "run_id": lease.run_id,
        "version": version,
        "record": orjson.loads(record.to_bytes()),
        "parent_pid": parent,
        "parent_pidfd": pidfd,
        "snapshot": snapshot,
    }


def _spawn_keeper(lease: Lease, settings: Settings, parent: int, *, snapshot: bool) -> int:
    """Start the detached keeper, the lease renewed and handed to it on its stdin; its pid."""
    with contextlib.ExitStack() as fds:  # this process's descriptors, closed at the end
        pidfd = _open_pidfd(parent)
        if pidfd is not None:
            fds.callback(os.close, pidfd)
        lease.stop_heartbeat()
        lease.renew()  # the keeper starts with a whole TTL ahead of it
        payload = _handover(lease, settings, parent, pidfd, snapshot)
        read_end, write_end = os.pipe()
        fds.callback(os.close, read_end)
        fds.callback(os.close, write_end)
        devnull = os.open(os.devnull, os.O_RDWR)
        fds.callback(os.close, devnull)
        if pidfd is not None:
            os.set_inheritable(pidfd, True)
        argv = [sys.executable, "-m", "mapper_state.meltano.keeper", KEEP_LEASE_ARG]
        keeper_pid = os.posix_spawn(
            sys.executable,
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read_end, 0),
                (os.POSIX_SPAWN_DUP2, devnull, 1),  # never hold Meltano's pipes open
                (os.POSIX_SPAWN_DUP2, devnull, 2),
            ],
            setsid=True,  # a Ctrl-C meant for Meltano must not kill it first
        )
        with open(write_end, "wb", closefd=False) as pipe:
            pipe.write(orjson.dumps(payload))
        return keeper_pid


def _wait_for_exit(pid: int, pidfd: int | None, stop: Any) -> None:
    """Return when process ``pid`` has ended, or ``stop`` (an Event) is set."""
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not stop.is_set():
            if poller.poll(200):
                return
        return
    while not stop.is_set():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        stop.wait(0.2)


def _snapshot(store: BlobStore, lease: Lease, settings: Settings) -> None:
    """Keep the state Meltano wrote in the history (under the lease it still holds)."""
    try:
        current = state.load(store, lease.state_id)
        if current.exists:
            history.record_if_missing(
                store,
                lease.state_id,
                current.value,
                keep=settings.history_keep,
                run_id=lease.run_id,
                note="meltano run",
            )
    except MapperStateError:
        pass  # nothing to tell anyone: the keeper's output goes nowhere


def _keep_lease() -> int:
    """The keeper: renew the handed-over lease until Meltano exits, then release it."""
    payload = orjson.loads(sys.stdin.buffer.read())
    settings = settings_from_values(payload["settings"])
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    record = LeaseRecord.from_bytes(orjson.dumps(payload["record"]))
    if record is None:
        return 1
    parent = int(payload["parent_pid"])
    record = replace(
        record,
        pid=runtime.pid(),
        command=f"{kept_for(parent)}{record.command}"[:200],
    )
    try:
        with contextlib.closing(open_configured_store(settings)) as store:
            lease = Lease.for_settings(
                store,
                payload["state_id"],
                settings,
                run_id=payload["run_id"],
                command=record.command,
                owner=record.owner,  # the Meltano run's token: it still knows this lease
            )
            lease.adopt(record, payload["version"])
            lease.renew()  # records who holds it now
            lease.start_heartbeat(on_lost=lambda _exc: stop.set())
            _wait_for_exit(parent, payload.get("parent_pidfd"), stop)
            if payload.get("snapshot") and not stop.is_set():
                _snapshot(store, lease, settings)
            lease.release()
    except MapperStateError:
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == [KEEP_LEASE_ARG]:
        sys.exit(_keep_lease())
    sys.exit("usage: python -m mapper_state.meltano.keeper keep-lease < handover.json (internal)")
