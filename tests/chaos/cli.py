"""Running the real ``mapper-state`` against a :class:`StoreLocation`, and reading the store
behind its back (straight from the emulator, never through a proxy)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mapper_state.stores.base import BlobStore
from tests.helpers import MAPPER, clean_env
from tests.servers import StoreLocation

LEASE_FILE = "mapper-state.lease.json"


def env_for(location: StoreLocation, **extra: str) -> dict[str, str]:
    return clean_env(**location.env, **extra)


def run(
    location: StoreLocation,
    *args: str,
    input: bytes = b"",
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [MAPPER, *args],
        input=input,
        capture_output=True,
        env=env or env_for(location),
        timeout=timeout,
        check=False,
    )


def spawn(location: StoreLocation, *args: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [MAPPER, *args],
        stdin=kw.pop("stdin", subprocess.PIPE),
        stdout=kw.pop("stdout", subprocess.PIPE),
        stderr=kw.pop("stderr", subprocess.PIPE),
        env=kw.pop("env", None) or env_for(location),
        **kw,
    )


def spawn_filter(
    location: StoreLocation, state_id: str, ttl: str, **kw: Any
) -> subprocess.Popen[bytes]:
    """The filter on ``state_id`` under a lease of ``ttl`` seconds, storing each state at once."""
    return spawn(
        location, "--state-id", state_id, "--lock-timeout-seconds", ttl,
        "--checkpoint-interval-seconds", "0", **kw,
    )  # fmt: skip


@contextmanager
def reaped(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """``proc``, killed and waited for on the way out if it is still running."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextmanager
def holding_filter(
    location: StoreLocation, direct: BlobStore, state_id: str, ttl: str
) -> Iterator[subprocess.Popen[bytes]]:
    """A filter (see :func:`spawn_filter`) once it holds the lease, as ``direct`` reads it."""
    with reaped(spawn_filter(location, state_id, ttl)) as holder:
        wait_for_holder(direct, state_id, holder.pid)
        yield holder


def injected_faults(proxy: Any) -> dict[str, int]:
    """How many requests the fault proxy hit with each fault."""
    injected: dict[str, int] = {}
    for r in proxy.requests():
        if r["fault"]:
            injected[r["fault"]] = injected.get(r["fault"], 0) + 1
    return injected


def lease_record(store: BlobStore, state_id: str) -> dict[str, Any] | None:
    blob = store.read(f"{state_id}/{LEASE_FILE}")
    if blob is None:
        return None
    try:
        record: dict[str, Any] = json.loads(blob.data)
    except ValueError:
        return None
    return record


def wait_for_holder(
    store: BlobStore, state_id: str, pid: int, timeout: float = 30
) -> dict[str, Any]:
    """The lease record once process ``pid`` holds the lease."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = lease_record(store, state_id)
        if record is not None and record.get("pid") == pid:
            return record
        time.sleep(0.05)
    raise AssertionError(
        f"pid {pid} never took the lease on {state_id}: {lease_record(store, state_id)}"
    )


def lease_is_free(location: StoreLocation, state_id: str) -> bool:
    """``mapper-state lock status --format json`` says free (straight to the emulator)."""
    proc = run(location, "lock", "status", state_id, "--format", "json", timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return bool(json.loads(proc.stdout)["free"])


def stored(store: BlobStore, state_id: str) -> Any:
    """The Singer state in ``state.json`` (``None`` when absent); a half-written one fails."""
    blob = store.read(f"{state_id}/state.json")
    if blob is None:
        return None
    doc = json.loads(blob.data)
    assert isinstance(doc, dict), doc
    assert "singer_state" in doc["completed"], doc
    return doc["completed"]["singer_state"]
