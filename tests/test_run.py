"""`mapper-state run` with small real tap and target processes (the PostgreSQL proof is in e2e)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    TINY_TAP,
    clean_env,
    run_cli,
    spawn_cli,
    stored_state,
    tiny_run,
    tiny_target,
    wait_for_lease,
    wait_until,
)
from tests.support.processes import pid_alive

TAP = TINY_TAP


def target(tmp_path: Path) -> str:
    return tiny_target(tmp_path / "out.jsonl")


def delivered(tmp_path: Path) -> list[int]:
    path = tmp_path / "out.jsonl"
    return (
        [json.loads(line)["i"] for line in path.read_text().splitlines()] if path.exists() else []
    )


job = tiny_run


def run(tmp_path: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    return run_cli(
        *job(tmp_path, *extra),
        cwd=tmp_path,
        env=clean_env(TINY_TAP_REPORT=str(tmp_path / "tap.json"), **env),
    )


def tap_report(tmp_path: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((tmp_path / "tap.json").read_text())
    return report


def test_incremental_runs_hand_the_tap_its_state(tmp_path: Path) -> None:
    first = run(tmp_path)
    assert first.returncode == 0, first.stderr
    assert tap_report(tmp_path)["argv"] == []  # no prior state: no --state at all
    assert first.stdout.splitlines() == [b'{"bookmarks": {"s": %d}}' % i for i in (1, 2, 3)]
    assert stored_state(tmp_path / ".mapper-state", "job") == {"bookmarks": {"s": 3}}
    second = run(tmp_path)
    assert second.returncode == 0, second.stderr
    report = tap_report(tmp_path)
    assert report["state"] == {"bookmarks": {"s": 3}}
    assert report["state_file_mode"] == "0o600"
    assert not Path(report["argv"][1]).exists()  # the private state file is removed
    assert delivered(tmp_path) == [1, 2, 3, 4, 5, 6]
    assert stored_state(tmp_path / ".mapper-state", "job") == {"bookmarks": {"s": 6}}


def test_full_refresh_starts_without_state(tmp_path: Path) -> None:
    run(tmp_path)
    assert run(tmp_path, "--full-refresh").returncode == 0
    assert tap_report(tmp_path)["argv"] == []
    assert delivered(tmp_path) == [1, 2, 3, 1, 2, 3]


def test_container_style_configuration_from_the_environment(tmp_path: Path) -> None:
    env = clean_env(
        MAPPER_STATE_STATE_ID="env-job",
        MAPPER_STATE_TAP=TAP,
        MAPPER_STATE_TARGET=target(tmp_path),
        MAPPER_STATE_STATE_BACKEND__URI=f"file://{tmp_path / 'bucket'}",
    )
    result = run_cli("run", cwd=tmp_path, env=env)  # ENTRYPOINT ["mapper-state", "run"]
    assert result.returncode == 0, result.stderr
    assert stored_state(tmp_path / "bucket", "env-job") == {"bookmarks": {"s": 3}}


def test_tap_failure_still_commits_what_the_target_confirmed(tmp_path: Path) -> None:
    result = run(tmp_path, TINY_TAP_FAIL="1")
    assert result.returncode == 7
    assert b"tiny-tap: failing on purpose" in result.stderr  # child stderr reaches ours
    assert b"the tap failed" in result.stderr
    assert stored_state(tmp_path / ".mapper-state", "job") == {"bookmarks": {"s": 3}}


def test_target_failure_commits_nothing_past_its_last_confirmation(tmp_path: Path) -> None:
    result = run(tmp_path, TINY_TAP_COUNT="5", TINY_TARGET_FAIL_AFTER="3")
    assert result.returncode == 8
    # records 1..3 written, states for 1 and 2 confirmed; 3's state never confirmed
    assert delivered(tmp_path) == [1, 2, 3]
    assert stored_state(tmp_path / ".mapper-state", "job") == {"bookmarks": {"s": 2}}
    again = run(tmp_path)
    assert again.returncode == 0
    assert delivered(tmp_path)[3:] == [3, 4, 5]  # at-least-once: nothing lost


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_and_the_confirmed_state_committed(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc = spawn_cli(
        *job(tmp_path, "--checkpoint-interval-seconds", "3600"),
        cwd=tmp_path,
        env=clean_env(TINY_TAP_COUNT="1000", TINY_TAP_SLEEP="0.05"),
    )
    wait_until(lambda: len(delivered(tmp_path)) >= 5, "five records delivered", timeout=20)
    children = _children_of(proc.pid)
    assert len(children) == 2
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    confirmed = json.loads(out.splitlines()[-1])
    assert stored_state(tmp_path / ".mapper-state", "job") == confirmed
    assert confirmed["bookmarks"]["s"] <= max(delivered(tmp_path))
    for pid in children:  # no child left running
        assert not pid_alive(pid)
    assert not (tmp_path / ".mapper-state" / "job" / "mapper-state.lease.json").exists()


def _children_of(pid: int) -> list[int]:
    """The children of ``pid``, not the watcher that outlives it (mapper_state.warden)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                watcher = b"mapper_state.warden" in Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and not watcher:
                found.append(int(entry))
    return found


def test_busy_lease_fails_at_once_without_starting_the_tap(tmp_path: Path) -> None:
    holder = spawn_cli("--state-id", "job", cwd=tmp_path)
    wait_for_lease(tmp_path / ".mapper-state", "job")
    result = run(tmp_path)
    holder.communicate(b"")
    assert result.returncode == 3
    assert b"is busy" in result.stderr
    assert not (tmp_path / "tap.json").exists()


def test_missing_commands_and_unstartable_children(tmp_path: Path) -> None:
    result = run_cli("run", "--state-id", "job", "--target", "cat", cwd=tmp_path)
    assert result.returncode == 2
    assert b"setting tap is required" in result.stderr
    result = run_cli(
        "run", "--state-id", "job", "--tap", "no-such-tap-x", "--target", "cat", cwd=tmp_path
    )
    assert result.returncode == 7
    assert b"cannot start the tap no-such-tap-x" in result.stderr
    assert b"Traceback" not in result.stderr
    assert not (tmp_path / ".mapper-state" / "job" / "mapper-state.lease.json").exists()


def test_sigterm_while_waiting_for_the_lease_exits_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "waiter.log"
    holder = spawn_cli("--state-id", "job", cwd=tmp_path)
    wait_for_lease(tmp_path / ".mapper-state", "job")
    waiter = spawn_cli(
        *job(tmp_path, "--lock-wait-seconds", "60", "--lock-retry-seconds", "0.1"),
        cwd=tmp_path,
        stderr=log.open("wb"),
    )
    # signal only once it is waiting (its handlers are in place), not after a fixed sleep
    wait_until(lambda: b"is busy, waiting up to 60s" in log.read_bytes(), "the waiter to wait")
    waiter.send_signal(signal.SIGTERM)
    waiter.communicate(timeout=10)
    err = log.read_bytes()
    assert waiter.returncode == 143, err
    assert b"interrupted by signal 15" in err
    holder.communicate(b"")
    assert holder.returncode == 0


def test_progress_line_on_a_terminal_and_quiet_json_logs_otherwise(tmp_path: Path) -> None:
    import pty

    from tests.helpers import MAPPER

    master, slave = pty.openpty()
    args = job(tmp_path)
    env = clean_env(TINY_TAP_COUNT="25", TINY_TAP_SLEEP="0.1")
    proc = subprocess.Popen(
        [MAPPER, *args, "--checkpoint-interval-seconds", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        cwd=tmp_path,
        env=env,
    )
    os.close(slave)
    screen = b""
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the terminal's other side closed
            break
        if not data:
            break
        screen += data
    os.close(master)
    assert proc.wait(30) == 0
    progress = [line for line in screen.split(b"\r") if line.startswith(b"mapper-state: ")]
    assert any(b"records (" in line and b"/s), " in line for line in progress), screen
    assert any(b"last commit" in line for line in progress), screen

    quiet = run_cli(*args, "--log-format", "json", cwd=tmp_path, env=env)
    assert quiet.returncode == 0
    lines = quiet.stderr.decode().splitlines()
    assert b"\r" not in quiet.stderr
    assert [json.loads(line)["message"] for line in lines] == ["run finished"]


def test_a_broken_lease_stops_the_whole_run(tmp_path: Path) -> None:
    proc = spawn_cli(
        *job(tmp_path, "--lock-timeout-seconds", "1.5"),
        cwd=tmp_path,
        env=clean_env(TINY_TAP_COUNT="1000", TINY_TAP_SLEEP="0.5"),
    )
    wait_until(lambda: delivered(tmp_path), "a record delivered", timeout=20)
    children = _children_of(proc.pid)
    assert run_cli("lock", "break", "job", "--yes", cwd=tmp_path).returncode == 0
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 4, err
    assert b"lost the lease" in err
    for pid in children:
        assert not pid_alive(pid)


#: A target that confirms each state by echoing the whole Singer STATE message it received.
ECHOING_TARGET = (
    f'{sys.executable} -c "import sys\n'
    "for line in sys.stdin:\n"
    '    if \'\\"STATE\\"\' in line: print(line.strip(), flush=True)"'
)


def test_a_target_that_echoes_state_messages_has_their_value_stored(tmp_path: Path) -> None:
    """Some targets confirm a state by echoing the STATE message itself: what is stored is
    its value, the state the tap reads back next time, not the message around it."""
    result = run_cli(
        "run", "--state-id", "job", "--tap", TAP, "--target", ECHOING_TARGET,
        cwd=tmp_path, env=clean_env(TINY_TAP_REPORT=str(tmp_path / "tap.json")),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert stored_state(tmp_path / ".mapper-state", "job") == {"bookmarks": {"s": 3}}


def test_a_killed_run_leaves_nothing_its_tap_started_running(tmp_path: Path) -> None:
    """SIGKILL of ``mapper-state run``: the tap and target die with it, and so does a
    process the tap started (a wrapper's helper, a grandchild of the run) before the
    lease expires."""
    helper = tmp_path / "helper.pid"
    tap = f"sh -c 'sleep 300 & echo $! > {helper}; exec {TAP} \"$@\"' tap"
    proc = spawn_cli(
        "run", "--state-id", "job", "--tap", tap, "--target", target(tmp_path),
        "--lock-timeout-seconds", "3",
        cwd=tmp_path,
        env=clean_env(TINY_TAP_COUNT="1000", TINY_TAP_SLEEP="0.05"),
    )  # fmt: skip
    try:
        wait_until(lambda: len(delivered(tmp_path)) >= 3, "records delivered", timeout=20)
        pid = int(helper.read_text())
        assert pid_alive(pid)
    finally:
        proc.kill()
        proc.wait(10)
    lease = tmp_path / ".mapper-state" / "job" / "mapper-state.lease.json"
    expires = json.loads(lease.read_bytes())["expires_at"]
    wait_until(lambda: not pid_alive(pid), "the tap's helper outlived the killed run", 15)
    assert time.time() < expires + 2  # gone by the lease's expiry (and its skew allowance)
