"""The lease through real processes: one holder, waiting, crashes, long runs, races."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.helpers import (
    clean_env,
    race_for_one_lease,
    run_cli,
    spawn_cli,
    state_line,
    stored_state,
    wait_for_lease,
    wait_until,
)

LEASE = "mapper-state.lease.json"


def test_second_run_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    holder = spawn_cli("--state-id", "dev:tap-to-target", cwd=tmp_path)
    record = wait_for_lease(tmp_path / ".mapper-state", "dev:tap-to-target")
    started = time.monotonic()
    second = run_cli("--state-id", "dev:tap-to-target", cwd=tmp_path, input=state_line({"x": 1}))
    assert time.monotonic() - started < 5
    assert second.returncode == 3
    err = second.stderr.decode()
    assert err.count("\n") == 1, err
    assert f"pid {holder.pid}" in err
    assert record["run_id"] in err
    assert record["host"] in err
    assert "since" in err
    assert "expires" in err
    assert second.stdout == b""  # nothing passed on without the lease
    holder.communicate(b"")
    assert holder.returncode == 0


def test_waiting_for_a_busy_lease_then_proceeding(tmp_path: Path) -> None:
    holder = spawn_cli("--state-id", "w", cwd=tmp_path)
    wait_for_lease(tmp_path / ".mapper-state", "w")
    waiter = spawn_cli(
        "--state-id", "w", "--lock-wait-seconds", "30", "--lock-retry-seconds", "0.1", cwd=tmp_path
    )
    time.sleep(1)
    assert waiter.poll() is None  # still waiting
    holder.communicate(state_line({"by": "holder"}))
    _out, err = waiter.communicate(state_line({"by": "waiter"}), timeout=30)
    assert waiter.returncode == 0, err
    assert stored_state(tmp_path / ".mapper-state", "w") == {"by": "waiter"}


def test_a_killed_holder_blocks_only_until_its_lease_expires(tmp_path: Path) -> None:
    ttl = "2"
    holder = spawn_cli("--state-id", "k", "--lock-timeout-seconds", ttl, cwd=tmp_path)
    wait_for_lease(tmp_path / ".mapper-state", "k")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    busy = run_cli("--state-id", "k", "--lock-timeout-seconds", ttl, cwd=tmp_path)
    assert busy.returncode == 3
    time.sleep(2 + 0.4 + 0.3)  # ttl + skew allowance (ttl/5) + margin
    after = run_cli("--state-id", "k", cwd=tmp_path, input=state_line({"ok": True}))
    assert after.returncode == 0, after.stderr
    assert stored_state(tmp_path / ".mapper-state", "k") == {"ok": True}


def test_a_run_longer_than_the_ttl_keeps_its_lease(tmp_path: Path) -> None:
    holder = spawn_cli("--state-id", "long", "--lock-timeout-seconds", "1", cwd=tmp_path)
    first = wait_for_lease(tmp_path / ".mapper-state", "long")
    time.sleep(3)
    busy = run_cli("--state-id", "long", cwd=tmp_path)
    assert busy.returncode == 3
    renewed = wait_for_lease(tmp_path / ".mapper-state", "long")
    assert renewed["run_id"] == first["run_id"]
    assert renewed["expires_at"] > first["expires_at"]
    holder.communicate(state_line({"done": 1}))
    assert holder.returncode == 0
    assert stored_state(tmp_path / ".mapper-state", "long") == {"done": 1}


def test_a_frozen_holder_that_lost_its_lease_is_fenced(tmp_path: Path) -> None:
    """SIGSTOP past the TTL: another run takes over; the old holder must not write."""
    store = tmp_path / ".mapper-state"
    holder = spawn_cli("--state-id", "f", "--lock-timeout-seconds", "1", cwd=tmp_path)
    first = wait_for_lease(store, "f")
    # frozen while passing data, not while starting: a run frozen between writing its lease
    # and starting finds it taken when it resumes, and is refused as busy (exit 3) instead
    assert holder.stdin is not None
    assert holder.stdout is not None
    record = b'{"type": "RECORD", "stream": "s", "record": {"i": 1}}\n'
    holder.stdin.write(record)
    holder.stdin.flush()
    assert holder.stdout.readline() == record
    holder.send_signal(signal.SIGSTOP)
    time.sleep(1.6)  # past the TTL and the skew allowance
    taker = spawn_cli("--state-id", "f", "--lock-wait-seconds", "30", cwd=tmp_path)
    wait_until(
        lambda: wait_for_lease(store, "f")["run_id"] != first["run_id"],
        "the taker never took the expired lease over",
        timeout=30,
    )
    holder.send_signal(signal.SIGCONT)
    _out, err = holder.communicate(state_line({"by": "stale holder"}), timeout=30)
    assert holder.returncode == 4, err
    assert b"lost the lease" in err
    taker.communicate(state_line({"by": "taker"}))
    assert taker.returncode == 0
    assert stored_state(store, "f") == {"by": "taker"}


def test_racing_processes_never_have_two_holders(tmp_path: Path) -> None:
    """Six real processes start together, eight times over: exactly one gets the lease."""
    race_for_one_lease(tmp_path, clean_env())
    assert not (tmp_path / ".mapper-state" / "race" / LEASE).exists()


def test_a_broken_lease_stops_an_idle_run_without_waiting_for_input(tmp_path: Path) -> None:
    """The heartbeat finds the lease gone and ends the run, though no byte arrives."""
    store = tmp_path / ".mapper-state"
    holder = spawn_cli("--state-id", "idle", "--lock-timeout-seconds", "1.5", cwd=tmp_path)
    wait_for_lease(store, "idle")
    broke = run_cli("lock", "break", "idle", "--yes", cwd=tmp_path)
    assert broke.returncode == 0, broke.stderr
    assert holder.wait(30) == 4  # stdin is still open and silent
    assert holder.stderr is not None
    assert b"lost the lease" in holder.stderr.read()
    assert stored_state(store, "idle") is None
