"""The record of every run, through the real command on the local store and on S3 (moto):
what `mapper-state runs`, `state list --long`, `--stale` and `--failed` show of a run that
succeeded, one that failed, one refused as busy after waiting, and one killed by SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from typing import Any

import pytest

from mapper_state.core.lease import Lease
from tests.conftest import ON_BOTH
from tests.helpers import StoreCli, state_line
from tests.support.processes import MAPPER, clean_env

SECRET = "TopSecret-7f3a9c"
#: A secret on the command line, which the records must hide.
SECRET_FLAG = ("--set", f"state_backend.s3.aws_secret_access_key={SECRET}")


def runs_of(cli: StoreCli, state_id: str) -> list[dict[str, Any]]:
    result = cli("runs", state_id, "--format", "json")
    assert result.returncode == 0, result.stderr
    runs: list[dict[str, Any]] = json.loads(result.stdout)
    return runs


def wait_for(what: str, check: Any, seconds: float = 20.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {seconds:g}s")


def killed_exec(cli: StoreCli, state_id: str) -> None:
    """``exec`` holding the lease (3 s TTL) on ``state_id``, SIGKILLed once its record shows
    it running: no end is ever written."""
    proc = subprocess.Popen(
        [
            MAPPER,
            "exec",
            "--state-id",
            state_id,
            "--lock-timeout-seconds",
            "3",
            "--",
            "sleep",
            "60",
        ],
        env=clean_env(**cli.env),
        cwd=cli.cwd,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            "the running record",
            lambda: (
                proc.poll() is not None
                or [r for r in runs_of(cli, state_id) if r["outcome"] == "running"]
            ),
            seconds=60,
        )
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def arrange_fleet(cli: StoreCli) -> None:
    """A succeeded, a failed, a busy-refused and a SIGKILLed run, one pipeline each."""
    ok = cli(
        "--state-id",
        "fleet:ok",
        *SECRET_FLAG,
        "--metrics-file",  # records are counted for the metrics
        str(cli.cwd / "ok.prom"),
        input=_stream(3, {"n": 1}),
    )
    assert ok.returncode == 0, ok.stderr
    assert cli("--state-id", "fleet:failed", input=_stream(1, {"n": 1})).returncode == 0
    failed = cli(
        "--state-id",
        "fleet:failed",
        "--strict",
        *SECRET_FLAG,
        input=state_line({"n": 2}) + b'{"type":"STATE","value":\n',
    )
    assert failed.returncode == 6, failed.stderr
    store = cli.open_store()
    cli.set("fleet:busy", {"n": 1})
    holder = Lease(store, "fleet:busy", ttl=60, run_id="holder-1")
    holder.acquire()
    try:
        busy = cli(
            "--state-id",
            "fleet:busy",
            "--lock-wait-seconds",
            "0.5",
            "--lock-retry-seconds",
            "0.1",
            input=_stream(1, {"n": 2}),
        )
    finally:
        holder.release()
        store.close()
    assert busy.returncode == 3, busy.stderr
    cli.set("fleet:killed", {"n": 1})
    killed_exec(cli, "fleet:killed")


def _stream(records: int, state: dict[str, Any]) -> bytes:
    lines = [b'{"type":"RECORD","stream":"s","record":{"id":%d}}\n' % i for i in range(records)]
    return b"".join(lines) + state_line(state)


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_each_run_leaves_a_record_of_how_it_ended(store_cli: StoreCli) -> None:
    cli = store_cli
    arrange_fleet(cli)

    [ok] = runs_of(cli, "fleet:ok")
    assert ok["outcome"] == "succeeded"
    assert ok["exit_code"] == 0
    assert (ok["records"], ok["states_seen"], ok["states_committed"]) == (3, 1, 1)
    assert ok["bytes"] == len(_stream(3, {"n": 1}))
    assert ok["host"] == socket.gethostname()
    assert isinstance(ok["pid"], int)
    assert ok["pid"] > 0
    assert ok["started_at"].endswith("Z")
    assert ok["ended_at"] >= ok["started_at"]
    assert "aws_secret_access_key=***" in ok["command"]

    failed, first = runs_of(cli, "fleet:failed")  # newest first
    assert first["outcome"] == "succeeded"
    assert failed["outcome"] == "failed"
    assert failed["exit_code"] == 6
    assert failed["records"] is None  # not counted without metrics
    assert failed["states_seen"] == 1
    assert failed["states_committed"] == 0

    [busy] = runs_of(cli, "fleet:busy")
    assert busy["outcome"] == "busy"
    assert busy["exit_code"] == 3
    assert busy["lease_wait_seconds"] >= 0.3  # it waited before it was refused

    killed = wait_for(
        "the killed run's lease to expire",
        lambda: [r for r in runs_of(cli, "fleet:killed") if r["outcome"] == "killed"],
    )
    assert killed[0]["ended_at"] is None
    assert killed[0]["mode"] == "exec"
    assert killed[0]["bytes"] is None  # exec passes no data itself

    table = cli("runs", "fleet:failed")
    assert table.returncode == 0
    lines = table.stdout.decode().splitlines()
    assert lines[0].split()[:4] == ["STARTED", "(UTC)", "RUN", "ID"]
    assert "failed (exit 6)" in lines[1]
    assert "succeeded" in lines[2]

    long = cli("state", "list", "--long", "--format", "json")
    assert long.returncode == 0, long.stderr
    last = {p["state_id"]: p["last_run"]["outcome"] for p in json.loads(long.stdout)}
    assert last == {
        "fleet:ok": "succeeded",
        "fleet:failed": "failed",
        "fleet:busy": "busy",
        "fleet:killed": "killed",
    }
    text = cli("state", "list", "--long").stdout.decode()
    assert "failed (exit 6)" in text
    assert "killed" in text

    failing = cli("state", "list", "--failed", "--format", "json")
    assert failing.returncode == 12, failing.stderr
    assert [p["state_id"] for p in json.loads(failing.stdout)] == ["fleet:failed", "fleet:killed"]
    stale = cli("state", "list", "--stale", "1h", "--failed", "--format", "json")
    assert [p["state_id"] for p in json.loads(stale.stdout)] == ["fleet:failed", "fleet:killed"]
    stale_only = cli("state", "list", "--stale", "1h", "--format", "json")
    assert stale_only.returncode == 0
    assert json.loads(stale_only.stdout) == []

    store = cli.open_store()
    try:
        keys = list(store.list(".mapper-state/runs/"))
        assert keys
        assert all(SECRET.encode() not in store.read(k).data for k in keys)
    finally:
        store.close()


def test_runs_keep_bounds_the_records(store_cli: StoreCli) -> None:
    cli = store_cli
    for n in range(4):
        result = cli("--state-id", "kept", input=state_line({"n": n}), MAPPER_STATE_RUNS_KEEP="2")
        assert result.returncode == 0, result.stderr
    assert len(runs_of(cli, "kept")) == 2
    assert (
        cli("--state-id", "none", input=state_line({}), MAPPER_STATE_RUNS_KEEP="0").returncode == 0
    )
    assert runs_of(cli, "none") == []
    assert b"no run records of none" in cli("runs", "none").stdout


def test_a_run_inside_exec_is_recorded_once_as_the_exec(store_cli: StoreCli) -> None:
    cli = store_cli
    env = clean_env(**cli.env)
    inner = f"printf '%s\\n' '{json.dumps({'type': 'STATE', 'value': {'n': 1}})}' | {MAPPER} --state-id wrapped"
    result = subprocess.run(
        [MAPPER, "exec", "--state-id", "wrapped", "--", "sh", "-c", f"{inner} >/dev/null"],
        env=env,
        cwd=cli.cwd,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    [run] = runs_of(cli, "wrapped")
    assert run["mode"] == "exec"
    assert run["outcome"] == "succeeded"
    assert os.fspath(MAPPER).rsplit("/", 1)[-1] in run["command"]


def test_a_lock_only_exec_is_listed_but_never_stale(store_cli: StoreCli) -> None:
    """``exec`` around a command that keeps no state: its runs show, it has no state to go stale."""
    cli = store_cli
    result = subprocess.run(
        [MAPPER, "exec", "--state-id", "nightly:dbt", "--", "true"],
        env=clean_env(**cli.env),
        cwd=cli.cwd,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    long = json.loads(cli("state", "list", "--long", "--format", "json").stdout)
    assert [(p["state_id"], p["last_written"], p["last_run"]["outcome"]) for p in long] == [
        ("nightly:dbt", None, "succeeded")
    ]
    stale = cli("state", "list", "--stale", "0s", "--format", "json")
    assert stale.returncode == 0, stale.stderr
    assert json.loads(stale.stdout) == []
