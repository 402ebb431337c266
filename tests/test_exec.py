"""``mapper-state exec -- COMMAND`` through real processes: the lease around a whole command.

The commands are small shell scripts that write markers into a log and wait on gate files,
so that each test says when a command is running and when it may end. The two-at-once and
the lock-break tests also run on S3 (moto).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mapper_state.config import load_settings
from mapper_state.core.lease import LeaseRecord, read_lease
from mapper_state.stores import open_configured_store
from tests.conftest import ON_BOTH
from tests.helpers import MAPPER, StoreCli, clean_env, spawn_cli, state_line, wait_until
from tests.proxy.pool import ProxyPool
from tests.servers import StoreLocation
from tests.support.processes import pid_alive

ID = "prod:elt"


def gated(log: Path, name: str, gate: Path, before: str = "", trap: str = "") -> list[str]:
    """``sh -c``: log ``start NAME``, run ``before``, wait for ``gate``, log ``end NAME``."""
    script = (
        f"{trap}echo start {name} >> {log}; {before}"
        f"while [ ! -e {gate} ]; do sleep 0.05; done; echo end {name} >> {log}"
    )
    return ["sh", "-c", script]


#: Every exec a test started, each in a session of its own (its command's process group too).
_spawned: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _nothing_left_running() -> Iterator[None]:
    """Whatever a test did, failed or not, no exec it started, nor its command, runs on."""
    yield
    while _spawned:
        proc = _spawned.pop()
        for pid in session_members(proc.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` (an exec started with ``start_new_session``)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat.rsplit(")", 1)[1].split()[3]) == sid:
            found.append(int(entry))
    return found


def spawn_exec(store_cli: StoreCli, *args: str, **kw: Any) -> subprocess.Popen[bytes]:
    proc = spawn_cli(
        "exec",
        *args,
        cwd=store_cli.cwd,
        env=clean_env(**store_cli.env),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        **kw,
    )
    _spawned.append(proc)
    return proc


def run_exec(store_cli: StoreCli, *args: str) -> subprocess.CompletedProcess[bytes]:
    proc = spawn_exec(store_cli, *args)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def lease_record(store_cli: StoreCli) -> LeaseRecord | None:
    """The lease object as it is in the store (any status), read as another host would."""
    store = open_configured_store(load_settings(env=store_cli.env))
    try:
        return read_lease(store, ID)[0]
    finally:
        store.close()


def is_held(store_cli: StoreCli) -> bool:
    record = lease_record(store_cli)
    return record is not None and record.held


def holder_of(store_cli: StoreCli) -> LeaseRecord:
    """The lease record once a holder has it."""
    wait_until(lambda: is_held(store_cli), "the exec never took the lease", 30)
    record = lease_record(store_cli)
    assert record is not None
    return record


# -- the command's exit status ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "status"),
    [("exit 0", 0), ("exit 7", 7), ("kill -KILL $$", 128 + 9), ("kill -TERM $$", 128 + 15)],
)
def test_the_exit_status_is_the_commands(store_cli: StoreCli, script: str, status: int) -> None:
    result = run_exec(store_cli, "--state-id", ID, "--", "sh", "-c", script)
    assert result.returncode == status, result.stderr
    assert not is_held(store_cli)  # released when the command ended


def test_exec_without_a_command_is_a_one_line_usage_error(store_cli: StoreCli) -> None:
    for args in (("--state-id", ID), ("--state-id", ID, "--")):
        result = run_exec(store_cli, *args)
        assert result.returncode == 2
        err = result.stderr.decode()
        assert err.count("\n") == 1, err
        assert "exec needs a command" in err


def test_a_command_that_cannot_be_run_exits_127_and_frees_the_lease(store_cli: StoreCli) -> None:
    result = run_exec(store_cli, "--state-id", ID, "--", "no-such-command-here")
    assert result.returncode == 127
    assert result.stderr.decode().count("\n") == 1
    assert not is_held(store_cli)


def test_the_lease_record_shows_no_secret_of_the_command(store_cli: StoreCli) -> None:
    gate = store_cli.cwd / "go"
    command = [  # short: the record keeps the first 200 characters
        "sh",
        "-c",
        "while [ ! -e go ]; do sleep 0.05; done",
        "sh",
        "--password",
        "hunter2-secret",
        "--api-token=tok-secret-9",
        "postgresql://user:pw-secret-1@db/x",
    ]
    proc = spawn_exec(store_cli, "--state-id", ID, "--", *command)
    held = holder_of(store_cli).command
    gate.touch()
    assert proc.wait(60) == 0
    assert "--password" in held
    for secret in ("hunter2-secret", "tok-secret-9", "pw-secret-1"):
        assert secret not in held


# -- one run at a time -----------------------------------------------------------------------


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_two_execs_at_once_one_is_refused_naming_the_holder(store_cli: StoreCli) -> None:
    log, gate = store_cli.cwd / "log", store_cli.cwd / "go"
    procs = [
        spawn_exec(store_cli, "--state-id", ID, "--", *gated(log, name, gate))
        for name in ("a", "b")
    ]
    wait_until(lambda: any(p.poll() is not None for p in procs), "neither exec was refused", 60)
    refused = next(p for p in procs if p.poll() is not None)
    holder = holder_of(store_cli)
    gate.touch()
    assert [p.wait(60) for p in procs].count(0) == 1
    assert refused.returncode == 3
    err = refused.communicate()[1].decode()
    assert err.count("\n") == 1, err
    assert "busy" in err
    assert holder.run_id in err
    assert f"pid {holder.pid}" in err
    assert len(lines(log)) == 2  # the refused command never started
    assert lines(log)[0].replace("start", "end") == lines(log)[1]


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_a_waiting_exec_starts_its_command_after_the_first_ends(store_cli: StoreCli) -> None:
    log, gate = store_cli.cwd / "log", store_cli.cwd / "go"
    wait = ("--lock-wait-seconds", "60", "--lock-retry-seconds", "0.2")
    first = spawn_exec(store_cli, "--state-id", ID, *wait, "--", *gated(log, "a", gate))
    holder_of(store_cli)
    second = spawn_exec(store_cli, "--state-id", ID, *wait, "--", *gated(log, "b", gate))
    time.sleep(1)  # the second is waiting meanwhile
    assert second.poll() is None
    assert lines(log) == ["start a"]
    gate.touch()
    assert first.wait(60) == 0
    assert second.wait(60) == 0
    assert lines(log) == ["start a", "end a", "start b", "end b"]


# -- signals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_reach_the_commands_trap_and_the_wrapper_waits(
    store_cli: StoreCli, signum: signal.Signals
) -> None:
    log = store_cli.cwd / "log"
    trap = f"trap 'echo trapped {signum.name} >> {log}; sleep 0.5; echo done >> {log}; exit 5' {signum.name[3:]}; "
    script = f"{trap}echo ready >> {log}; while :; do sleep 0.05; done"
    proc = spawn_exec(store_cli, "--state-id", ID, "--", "sh", "-c", script)
    wait_until(lambda: lines(log) == ["ready"], "the command never started", 30)
    proc.send_signal(signum)
    assert proc.wait(60) == 5  # the command's status: the wrapper waited for its trap
    assert lines(log) == ["ready", f"trapped {signum.name}", "done"]
    assert not is_held(store_cli)


def test_a_signal_while_waiting_for_the_lease_stops_the_exec_before_its_command(
    store_cli: StoreCli,
) -> None:
    log, gate = store_cli.cwd / "log", store_cli.cwd / "go"
    first = spawn_exec(store_cli, "--state-id", ID, "--", *gated(log, "a", gate))
    holder_of(store_cli)
    wait = ("--lock-wait-seconds", "60", "--lock-retry-seconds", "0.1")
    err = store_cli.cwd / "second.err"
    with open(err, "wb") as out:
        second = spawn_exec(
            store_cli, "--state-id", ID, *wait, "--", *gated(log, "b", gate), stderr=out
        )
    wait_until(lambda: "busy" in err.read_text(), "the second never waited", 30)
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 128 + signal.SIGTERM
    gate.touch()
    assert first.wait(60) == 0
    assert lines(log) == ["start a", "end a"]  # b never started


def test_a_killed_wrapper_takes_its_command_down(store_cli: StoreCli) -> None:
    log = store_cli.cwd / "log"
    script = f"trap 'echo stopped >> {log}; exit 1' TERM; echo ready >> {log}; while :; do sleep 0.05; done"
    proc = spawn_exec(store_cli, "--state-id", ID, "--", "sh", "-c", script)
    wait_until(lambda: lines(log) == ["ready"], "the command never started", 30)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    wait_until(lambda: "stopped" in lines(log), "the command outlived its wrapper", 10)


def test_a_killed_wrapper_leaves_no_process_of_its_command_alive(store_cli: StoreCli) -> None:
    """SIGKILL of exec around a command whose own children do the work (a Meltano run and
    its dbt step): they are all gone once the lease it ran under has expired."""
    pids = store_cli.cwd / "pids"
    step = f"sh -c 'echo $$ >> {pids}; trap \"\" TERM; while :; do sleep 0.05; done'"
    script = f"{step} & {step} & echo $$ >> {pids}; wait"
    proc = spawn_exec(
        store_cli, "--state-id", ID, "--lock-timeout-seconds", "3", "--", "sh", "-c", script
    )
    wait_until(lambda: len(lines(pids)) == 3, "the command never started its steps", 30)
    held = holder_of(store_cli)
    proc.kill()
    proc.wait(10)
    started = [int(pid) for pid in lines(pids)]
    wait_until(
        lambda: not any(pid_alive(pid) for pid in started),
        "a step of the killed exec's command ran on",
        held.ttl_seconds + 10,
    )
    left = lease_record(store_cli)
    assert left is not None
    assert time.time() < left.expires_at + 2  # by the lease's expiry and its skew allowance


def test_what_the_command_leaves_running_is_stopped_before_the_lease_is_freed(
    store_cli: StoreCli,
) -> None:
    pid_file = store_cli.cwd / "straggler"
    script = f"sleep 300 > /dev/null 2>&1 & echo $! > {pid_file}; exit 0"
    result = run_exec(store_cli, "--state-id", ID, "--", "sh", "-c", script)
    assert result.returncode == 0, result.stderr
    assert not pid_alive(int(pid_file.read_text()))
    assert not is_held(store_cli)


def test_a_refused_exec_names_the_store_and_says_what_to_do(store_cli: StoreCli) -> None:
    log, gate = store_cli.cwd / "log", store_cli.cwd / "go"
    first = spawn_exec(store_cli, "--state-id", ID, "--", *gated(log, "a", gate))
    holder_of(store_cli)
    refused = run_exec(store_cli, "--state-id", ID, "--", "true")
    gate.touch()
    assert first.wait(60) == 0
    assert refused.returncode == 3
    err = refused.stderr.decode()
    assert err.count("\n") == 1, err
    assert "(store " in err
    assert "retry when it has finished, set lock_wait_seconds" in err


# -- a lost lease stops the command before the lease expires -----------------------------------


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_a_lock_break_stops_the_command_before_the_lease_expires(store_cli: StoreCli) -> None:
    ttl = 6.0
    log, ended = store_cli.cwd / "log", store_cli.cwd / "ended"
    trap = f"trap 'date +%s.%N > {ended}; exit 0' TERM; "
    script = f"{trap}echo ready >> {log}; while :; do sleep 0.05; done"
    proc = spawn_exec(
        store_cli, "--state-id", ID, "--lock-timeout-seconds", str(ttl), "--", "sh", "-c", script
    )
    wait_until(lambda: lines(log) == ["ready"], "the command never started", 30)
    before = holder_of(store_cli)
    assert store_cli("lock", "break", ID, "--yes").returncode == 0
    broken = lease_record(store_cli)
    assert broken is not None
    assert broken.status in ("broken", "released")  # the command may have stopped already
    assert proc.wait(60) == 4
    after = lease_record(store_cli)
    assert after is not None
    assert after.status == "released"
    err = proc.communicate()[1].decode()  # the shell may say its sleep was Terminated
    ours = [line for line in err.splitlines() if line.startswith("mapper-state:")]
    assert len(ours) == 1, err
    assert "lost the lease" in err
    assert "broken by an operator" in err
    end = float(ended.read_text())
    assert end < before.expires_at  # before the lease the command ran under expired
    print(
        f"exec on {store_cli.name}: lock break -> command ended after "
        f"{end - broken.renewed_at:.2f} s (TTL {ttl:g} s; the lease it ran under would have "
        f"expired {before.expires_at - end:.2f} s later)"
    )


def test_a_command_that_ignores_sigterm_is_killed_before_the_lease_expires(
    store_cli: StoreCli,
) -> None:
    log = store_cli.cwd / "log"
    script = f"trap '' TERM; echo ready >> {log}; while :; do sleep 0.05; done"
    proc = spawn_exec(
        store_cli, "--state-id", ID, "--lock-timeout-seconds", "6", "--", "sh", "-c", script
    )
    wait_until(lambda: lines(log) == ["ready"], "the command never started", 30)
    before = holder_of(store_cli)
    assert store_cli("lock", "break", ID, "--yes").returncode == 0
    assert proc.wait(60) == 4
    assert time.time() < before.expires_at
    assert "exited 137" in proc.communicate()[1].decode()


# -- nested mapper-states write under the exec's lease ------------------------------------------


def test_nested_state_set_filter_and_run_write_under_the_lease_outside_refused(
    store_cli: StoreCli,
) -> None:
    log, gate = store_cli.cwd / "log", store_cli.cwd / "go"
    (store_cli.cwd / "tap.sh").write_bytes(
        b"echo " + shlex.quote(state_line({"n": 3}).decode()).encode()
    )
    mapper = shlex.quote(MAPPER)
    inside = (
        f"{mapper} state set {ID} '{{\"n\": 1}}' && echo set >> {log} && "
        f"printf '%s' {shlex.quote(state_line({'n': 2}).decode())} "
        f"| {mapper} --state-id {ID} > /dev/null && echo filter >> {log} && "
        f"{mapper} run --state-id {ID} --tap 'sh tap.sh' --target cat > /dev/null "
        f"&& echo run >> {log}; echo done >> {log}; "
    )
    proc = spawn_exec(store_cli, "--state-id", ID, "--", *gated(log, "x", gate, before=inside))
    wait_until(lambda: "done" in lines(log), "the nested commands never ended", 60)
    assert lines(log) == ["start x", "set", "filter", "run", "done"]
    holder = holder_of(store_cli)
    assert store_cli.get(ID) == {"n": 3}
    outside = store_cli("state", "set", ID, '{"n": 4}')
    assert outside.returncode == 3, outside.stderr
    assert holder.run_id in outside.stderr.decode()
    assert store_cli("--state-id", ID, input=state_line({"n": 5})).returncode == 3
    gate.touch()
    assert proc.wait(60) == 0, proc.communicate()[1]
    assert lines(log) == ["start x", "set", "filter", "run", "done", "end x"]
    assert store_cli.get(ID) == {"n": 3}
    history = json.loads(store_cli("state", "history", ID, "--format", "json").stdout)
    assert [s["singer_state"] for s in reversed(history)] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert {s["run_id"] for s in history} == {holder.run_id}


def test_a_nested_write_after_the_lease_was_broken_is_refused(store_cli: StoreCli) -> None:
    log, gate = store_cli.cwd / "log", store_cli.cwd / "go"
    late = f"{shlex.quote(MAPPER)} state set {ID} '{{\"n\": 9}}' 2>> {log}; echo rc=$? >> {log}"
    script = f"echo ready >> {log}; while [ ! -e {gate} ]; do sleep 0.05; done; {late}"
    proc = spawn_exec(store_cli, "--state-id", ID, "--", "sh", "-c", script)
    wait_until(lambda: lines(log) == ["ready"], "the command never started", 30)
    assert store_cli("lock", "break", ID, "--yes").returncode == 0
    gate.touch()
    proc.wait(60)
    assert lines(log)[-1] == "rc=4"
    assert "not writing" in lines(log)[1]
    assert store_cli.get(ID) is None


def test_an_exec_inside_an_exec_on_the_same_id_runs_under_its_lease(store_cli: StoreCli) -> None:
    inner = f"{shlex.quote(MAPPER)} exec --state-id {ID} -- sh -c 'exit 6'"
    result = run_exec(store_cli, "--state-id", ID, "--", "sh", "-c", inner)
    assert result.returncode == 6, result.stderr


@pytest.mark.cloud
def test_a_store_that_stops_answering_stops_the_command_before_the_lease_expires(
    s3_location: StoreLocation, proxy_pool: ProxyPool, tmp_path: Path
) -> None:
    """Every write under the state ID is black-holed (the wrapper's renewals hang): the
    heartbeat gives the lease up before its expiry and the command is stopped in time."""
    direct = StoreCli.cloud(s3_location, tmp_path)
    with proxy_pool.lease(s3_location.emulator.endpoint) as proxy:
        env = {**s3_location.env, "MAPPER_STATE_STATE_BACKEND__S3__ENDPOINT_URL": proxy.url}
        faulty = StoreCli("moto through a fault proxy", env, tmp_path)
        log, ended = tmp_path / "log", tmp_path / "ended"
        trap = f"trap 'date +%s.%N > {ended}; exit 0' TERM; "
        script = f"{trap}echo ready >> {log}; while :; do sleep 0.05; done"
        proc = spawn_exec(
            faulty, "--state-id", ID, "--lock-timeout-seconds", "6", "--", "sh", "-c", script
        )
        wait_until(lambda: lines(log) == ["ready"], "the command never started", 30)
        proxy.set_faults(
            blackhole=1.0, blackhole_seconds=120, match="mapper-state.lease.json", methods=["PUT"]
        )
        last = holder_of(direct)  # the last renewal that got through
        assert proc.wait(60) == 4
        err = proc.communicate()[1].decode()
    assert "could not renew it before it expired" in err, err
    end = float(ended.read_text())
    assert end < last.expires_at
    print(f"exec, renewals black-holed: command ended {last.expires_at - end:.2f} s before expiry")
