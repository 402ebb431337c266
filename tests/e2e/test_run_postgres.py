"""``mapper-state run`` with meltanolabs-tap-postgres, target-jsonl / target-csv and PostgreSQL.

The tap replicates one table INCREMENTAL on ``updated_at``. Its filter is ``>=`` the
bookmark, so every run after the first re-sends the bookmark row itself: "only the new
rows" below always means the new rows plus that one row.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.e2e.conftest import Mapper, Source, Store, Target, kill_if_running


@pytest.mark.parametrize("store", ["local", "s3"], indirect=True)
def test_second_run_delivers_only_new_rows(
    source: Source, target: Target, store: Store, mapper: Mapper, state_id: str
) -> None:
    """Run, insert rows, run again: the second run delivers the new rows only, and the store
    holds the new bookmark (the state the target printed once it had written the rows)."""
    source.insert(1, 5)

    first = mapper.run(state_id, source, target, "first")
    assert first.returncode == 0, first.stderr
    assert sorted(target.delivered("first", source.stream)) == [1, 2, 3, 4, 5]
    # the state the target confirmed is echoed on stdout, and it is what was committed
    confirmed = [json.loads(line) for line in first.stdout.splitlines()]
    assert confirmed == [source.state(5)], f"{target.name} printed {first.stdout!r}"
    assert mapper.state_get(state_id) == source.state(5)

    source.insert(6, 8)
    second = mapper.run(state_id, source, target, "second")
    assert second.returncode == 0, second.stderr
    # the tap got the stored bookmark: rows 1-4 are not sent again; row 5 is, because
    # tap-postgres selects updated_at >= bookmark (it re-sends the bookmark row)
    assert sorted(target.delivered("second", source.stream)) == [5, 6, 7, 8]
    assert mapper.state_get(state_id) == source.state(8)
    # read the store without mapper-state: Meltano's layout, the new bookmark
    assert store.document(state_id) == {
        "completed": {"singer_state": source.state(8)},
        "partial": {},
    }
    assert mapper.lock_status(state_id)["free"] is True  # the lease was released


def test_run_without_new_rows_keeps_the_bookmark(
    source: Source, jsonl: Target, mapper: Mapper, state_id: str
) -> None:
    """A run that finds nothing new re-sends only the bookmark row and stores no other state.

    tap-postgres ends such a run on the re-sent RECORD with no final STATE, and
    target-jsonl then confirms nothing: the prior state must stay as it was.
    """
    source.insert(1, 3)
    assert mapper.run(state_id, source, jsonl, "first").returncode == 0
    again = mapper.run(state_id, source, jsonl, "again")
    assert again.returncode == 0, again.stderr
    assert jsonl.delivered("again", source.stream) == [3]
    assert again.stdout == ""  # nothing confirmed
    assert mapper.state_get(state_id) == source.state(3)


def _start_together(
    mapper: Mapper, state_id: str, source: Source, target: Target, *extra: str
) -> dict[str, subprocess.Popen[str]]:
    return {run: mapper.spawn(state_id, source, target, run, *extra) for run in ("a", "b")}


@pytest.mark.parametrize("store", ["local", "s3"], indirect=True)
def test_two_runs_started_together_one_fails_at_once_with_the_holder(
    source: Source, jsonl: Target, mapper: Mapper, state_id: str
) -> None:
    """Exactly one of two runs started together gets the lease; the other exits 3 at once,
    saying which run, host and pid hold it, without starting its tap (on S3 as well: the
    acquire is a conditional create, not a check-then-write)."""
    source.insert(1, 5)
    started = time.monotonic()
    procs = _start_together(mapper, state_id, source, jsonl)
    ended: dict[str, float] = {}
    try:
        while len(ended) < len(procs):
            for run, proc in procs.items():
                if run not in ended and proc.poll() is not None:
                    ended[run] = time.monotonic()
            assert time.monotonic() - started < 120, "the runs did not finish"
            time.sleep(0.02)
    finally:
        for proc in procs.values():
            kill_if_running(proc)
    codes = {run: proc.returncode for run, proc in procs.items()}
    assert sorted(codes.values()) == [0, 3], f"exit codes {codes}: {mapper.output('a')}"
    winner = next(run for run, code in codes.items() if code == 0)
    loser = next(run for run, code in codes.items() if code == 3)

    _, err = mapper.output(loser)
    # the busy error says who holds the lease: the winner's run, host and pid
    assert f"state ID {state_id} is busy: held by run " in err, err
    assert f"(pid {procs[winner].pid})" in err, err
    assert "expires " in err
    assert "Traceback" not in err
    # it failed at once: it did not wait for the winner to finish, and started no tap
    assert ended[loser] - started < ended[winner] - started, "the loser waited for the winner"
    assert ended[loser] - started < 10
    assert jsonl.delivered(loser, source.stream) == []
    assert not jsonl.out_dir(loser).exists()

    assert sorted(jsonl.delivered(winner, source.stream)) == [1, 2, 3, 4, 5]
    assert mapper.state_get(state_id) == source.state(5)
    assert mapper.lock_status(state_id)["free"] is True


def test_two_runs_started_together_the_second_waits_with_lock_wait_seconds(
    source: Source, jsonl: Target, mapper: Mapper, state_id: str
) -> None:
    """With ``lock_wait_seconds`` the second run waits for the lease, then runs on the first's
    state: the rows are delivered once, plus the bookmark row the tap always re-sends."""
    source.insert(1, 5)
    procs = _start_together(
        mapper, state_id, source, jsonl, "--lock-wait-seconds", "120", "--lock-retry-seconds", "0.2"
    )
    try:
        for proc in procs.values():
            proc.wait(timeout=150)
    finally:
        for proc in procs.values():
            kill_if_running(proc)
    for run, proc in procs.items():
        assert proc.returncode == 0, f"run {run}: exit {proc.returncode}\n{mapper.output(run)[1]}"
    deliveries = sorted(
        (jsonl.delivered(run, source.stream) for run in procs), key=len, reverse=True
    )
    # one ran first (no prior state: everything), the other after it (its state: row 5 only)
    assert [sorted(d) for d in deliveries] == [[1, 2, 3, 4, 5], [5]]
    assert mapper.state_get(state_id) == source.state(5)
    assert mapper.lock_status(state_id)["free"] is True
