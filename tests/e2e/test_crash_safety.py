"""Crash safety of ``mapper-state run`` with tap-postgres, target-jsonl and a real store.

What a mid-run kill can and cannot show with these real tools:

* Neither real target confirms anything before the end of its input: target-jsonl
  prints one state at exit, target-csv drains (and prints) at the end or when a
  record is 5 minutes old. So at any moment of a run, the last *confirmed* state is
  the one of the previous, completed run. Each test therefore first completes a run
  (rows 1-5, bookmark row 5), then inserts enough rows that the killed run is well
  under way when it dies.
* tap-postgres emits a STATE every 10,000 records (docs/real-tools.md). The kill
  comes after target-jsonl has written more than 12,000 rows of the run, so the tap's
  first in-run STATE (with a newer bookmark) had already gone through mapper-state to
  the target: a mapper-state that stored what it saw rather than what the target
  confirmed would store it (``--checkpoint-interval-seconds 0`` makes any such write
  immediate). The tests prove that the stored state stays at the confirmed one, and
  that the next run, started from it, delivers every row: at-least-once, with the
  rows of the killed run delivered again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.e2e.conftest import (
    Mapper,
    Source,
    Store,
    Target,
    children_of,
    is_gone,
    kill_if_running,
    wait_for,
)

NEW_ROWS = 30_000
KILL_AFTER = 12_000  # rows written by the target in the killed run (past the tap's 10,000 STATE)
TTL = 5.0
RETRY = 0.2
# README: an expired lease is taken over once its expires_at + min(2 s, TTL/5) has passed
SKEW = min(2.0, TTL / 5)


def line_count(path: os.PathLike[str]) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def first_run_and_new_rows(
    source: Source, jsonl: Target, mapper: Mapper, state_id: str, *extra: str
) -> None:
    """A completed run over rows 1-5 (committed bookmark: row 5), then NEW_ROWS more rows."""
    source.insert(1, 5)
    first = mapper.run(state_id, source, jsonl, "first", *extra)
    assert first.returncode == 0, first.stderr
    assert mapper.state_get(state_id) == source.state(5)
    source.insert(6, 5 + NEW_ROWS)


def wait_until_mid_run(proc: subprocess.Popen[str], jsonl: Target, run: str, stream: str) -> None:
    out = jsonl.output_file(run, stream)
    wait_for(
        lambda: line_count(out) > KILL_AFTER or proc.poll() is not None,
        120,
        f"target-jsonl to write {KILL_AFTER} rows",
        interval=0.01,
    )
    assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before the kill"


def assert_every_row_delivered(jsonl: Target, source: Source, runs: list[str]) -> list[int]:
    delivered = [i for run in runs for i in jsonl.delivered(run, source.stream)]
    missing = set(range(1, 6 + NEW_ROWS)) - set(delivered)
    assert not missing, f"{len(missing)} rows lost, e.g. {sorted(missing)[:5]}"
    return delivered


def test_target_killed_mid_run_stores_nothing_it_did_not_confirm(
    source: Source, jsonl: Target, store: Store, mapper: Mapper, state_id: str
) -> None:
    """SIGKILL target-jsonl mid-run: the stored state stays the last one the target confirmed
    (the previous run's), the run exits 8, and the next run loses no row."""
    first_run_and_new_rows(source, jsonl, mapper, state_id)

    proc = mapper.spawn(state_id, source, jsonl, "killed", "--checkpoint-interval-seconds", "0")
    try:
        wait_until_mid_run(proc, jsonl, "killed", source.stream)
        targets = [pid for pid, cmd in children_of(proc.pid).items() if "target-jsonl" in cmd]
        assert len(targets) == 1, children_of(proc.pid)
        os.kill(targets[0], signal.SIGKILL)
        code = proc.wait(timeout=60)
    finally:
        kill_if_running(proc)
    stdout, stderr = mapper.output("killed")
    assert code == 8, stderr[-3000:]
    assert "the target failed" in stderr
    written = jsonl.delivered("killed", source.stream)
    assert KILL_AFTER < len(written) < NEW_ROWS + 1, "the target was not killed mid-run"

    # not ahead of the target: it confirmed nothing in this run, so the state is the
    # previous run's, although newer tap STATEs went through mapper-state
    assert stdout == ""
    assert mapper.state_get(state_id) == source.state(5)
    assert store.document(state_id) == {
        "completed": {"singer_state": source.state(5)},
        "partial": {},
    }
    assert store.lease(state_id) is None  # released on the way out

    again = mapper.run(state_id, source, jsonl, "again")
    assert again.returncode == 0, again.stderr
    # resumed from the confirmed bookmark (row 5, re-sent by the tap's >=): every new row
    assert jsonl.delivered("again", source.stream) == list(range(5, 6 + NEW_ROWS))
    delivered = assert_every_row_delivered(jsonl, source, ["first", "killed", "again"])
    assert len(delivered) > len(set(delivered))  # at-least-once: the killed run's rows again
    assert mapper.state_get(state_id) == source.state(5 + NEW_ROWS)


@pytest.mark.parametrize("store", ["local", "s3"], indirect=True)
def test_mapper_state_killed_mid_run_next_run_takes_over_after_the_ttl(
    source: Source, jsonl: Target, store: Store, mapper: Mapper, state_id: str
) -> None:
    """SIGKILL mapper-state itself mid-run (as an OOM killer or a container runtime would).

    Its children die with it (they get SIGTERM from the kernel); its lease stays in the
    store, so a run started at once fails with exit 3 naming the dead holder; a run that
    waits takes the lease over no later than the TTL (plus the documented clock-skew
    allowance, min(2 s, TTL/5), and one retry interval) after the kill, starts from the
    last committed state and loses no row.
    """
    lease = ("--lock-timeout-seconds", str(TTL), "--lock-retry-seconds", str(RETRY))
    first_run_and_new_rows(source, jsonl, mapper, state_id, *lease)

    proc = mapper.spawn(
        state_id, source, jsonl, "killed", *lease, "--checkpoint-interval-seconds", "0"
    )
    try:
        wait_until_mid_run(proc, jsonl, "killed", source.stream)
        children = children_of(proc.pid)
        assert len(children) == 2, children  # the tap and the target
        proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        proc.wait(timeout=30)
    finally:
        kill_if_running(proc)

    # at once: the dead run's lease still stands, so a run that does not wait fails,
    # naming the dead holder, and starts nothing
    dead = store.lease(state_id)
    assert dead is not None
    assert dead["pid"] == proc.pid, dead
    busy = mapper.run(state_id, source, jsonl, "busy", *lease)
    assert busy.returncode == 3, busy.stderr
    assert f"is busy: held by run {dead['run_id']}" in busy.stderr
    assert f"(pid {proc.pid})" in busy.stderr
    assert not jsonl.out_dir("busy").exists()

    # a run that waits; while it waits, check what the crash left behind
    resumed = mapper.spawn(state_id, source, jsonl, "resumed", *lease, "--lock-wait-seconds", "60")
    try:
        wait_for(
            lambda: all(is_gone(pid) for pid in children), 20, f"the children {children} to exit"
        )
        assert len(jsonl.delivered("killed", source.stream)) < NEW_ROWS + 1
        # the last committed state is intact: the previous run's (nothing confirmed since)
        assert store.document(state_id) == {
            "completed": {"singer_state": source.state(5)},
            "partial": {},
        }
        wait_for(
            lambda: (
                (store.lease(state_id) or {}).get("pid") == resumed.pid
                or resumed.poll() is not None
            ),
            60,
            "the waiting run to take the lease over",
            interval=0.05,
        )
        acquired_at = time.time()
        code = resumed.wait(timeout=120)
    finally:
        kill_if_running(resumed)
    _, stderr = mapper.output("resumed")
    assert code == 0, stderr[-3000:]

    waited = acquired_at - killed_at
    limit = TTL + SKEW + RETRY + 2.0  # + 2 s for polling and a busy machine
    assert waited <= limit, f"took the lease over {waited:.1f}s after the kill (limit {limit:.1f}s)"
    assert acquired_at >= dead["expires_at"] + SKEW, "took over a lease that had not expired"
    assert waited >= TTL / 2, f"took the lease over only {waited:.1f}s after the kill"

    # resumed from the last committed state: row 5 (re-sent, >=) and every new row
    assert jsonl.delivered("resumed", source.stream) == list(range(5, 6 + NEW_ROWS))
    assert_every_row_delivered(jsonl, source, ["first", "killed", "resumed"])
    assert mapper.state_get(state_id) == source.state(5 + NEW_ROWS)
    assert store.lease(state_id) is None
