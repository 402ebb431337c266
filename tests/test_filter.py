"""The filter through the real CLI: commits, Meltano layout, lease, policy flags."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from tests.helpers import (
    clean_env,
    record_line,
    spawn_cli,
    state_line,
    stored_document,
    stored_state,
    wait_for_lease,
    wait_until,
)
from tests.support.cli import invoke_filter as run_cli
from tests.support.cli import one_line_error


def store_of(tmp_path: Path) -> Path:
    return tmp_path / ".mapper-state"


def stream(*states: int, records_between: int = 3) -> bytes:
    out = b'{"type":"SCHEMA","stream":"s","schema":{},"key_properties":[]}\n'
    for n in states:
        out += b"".join(record_line(i) for i in range(records_between))
        out += state_line({"bookmarks": {"s": {"replication_key_value": n}}})
    return out


def test_newest_state_is_stored_in_meltano_layout(tmp_path: Path) -> None:
    data = stream(1, 2, 3)
    result = run_cli("--state-id", "dev:tap-a-to-target-b", cwd=tmp_path, input=data)
    assert result.returncode == 0, result.stderr
    assert result.stdout == data
    doc = stored_document(store_of(tmp_path), "dev:tap-a-to-target-b")
    assert doc is not None
    writer = doc.pop("mapper_state")  # beside Meltano's keys, which Meltano ignores
    assert doc == {
        "completed": {"singer_state": {"bookmarks": {"s": {"replication_key_value": 3}}}},
        "partial": {},
    }
    assert writer["serial"] >= 1
    assert len(writer["run_id"]) == 12
    assert writer["written_at"] > 0
    state_dir = store_of(tmp_path) / "dev:tap-a-to-target-b"
    assert oct((state_dir / "state.json").stat().st_mode & 0o777) == "0o600"
    assert not (state_dir / "mapper-state.lease.json").exists()  # released


def test_no_state_in_a_run_keeps_the_prior_state(tmp_path: Path) -> None:
    run_cli("--state-id", "p", cwd=tmp_path, input=stream(7))
    before = (store_of(tmp_path) / "p" / "state.json").read_bytes()
    result = run_cli("--state-id", "p", cwd=tmp_path, input=record_line(1))
    assert result.returncode == 0
    assert (store_of(tmp_path) / "p" / "state.json").read_bytes() == before


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    result = run_cli("--state-id", "d", "--dry-run", cwd=tmp_path, input=stream(1, 2))
    assert result.returncode == 0
    assert result.stdout == stream(1, 2)
    assert stored_document(store_of(tmp_path), "d") is None


def test_state_merge_deep_merges_over_the_prior_state(tmp_path: Path) -> None:
    run_cli("--state-id", "m", cwd=tmp_path, input=state_line({"bookmarks": {"a": 1, "b": 1}}))
    result = run_cli(
        "--state-id", "m", "--state-merge", cwd=tmp_path, input=state_line({"bookmarks": {"b": 2}})
    )
    assert result.returncode == 0
    assert stored_state(store_of(tmp_path), "m") == {"bookmarks": {"a": 1, "b": 2}}


def test_after_target_stores_bare_states(tmp_path: Path) -> None:
    data = b'{"bookmarks": {"s": 1}}\n\n{"bookmarks": {"s": 2}}\n'
    result = run_cli("--state-id", "after", "--after-target", cwd=tmp_path, input=data)
    assert result.returncode == 0, result.stderr
    assert result.stdout == data
    assert stored_state(store_of(tmp_path), "after") == {"bookmarks": {"s": 2}}


def test_input_file(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_bytes(stream(5))
    result = run_cli("--state-id", "i", "--input", "in.jsonl", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == stream(5)
    assert stored_state(store_of(tmp_path), "i") == {
        "bookmarks": {"s": {"replication_key_value": 5}}
    }


def test_strict_makes_a_bad_state_fatal(tmp_path: Path) -> None:
    data = state_line({"ok": 1}) + b'{"type": "STATE", "value": {oops}\n'
    lenient = run_cli("--state-id", "s1", cwd=tmp_path, input=data)
    assert lenient.returncode == 0
    assert b"warning" in lenient.stderr
    strict = run_cli("--state-id", "s2", "--strict", cwd=tmp_path, input=data)
    assert strict.returncode == 6
    assert b"--strict" in strict.stderr
    assert b"Traceback" not in strict.stderr


def test_state_file_regular_path_gets_prior_state(tmp_path: Path) -> None:
    run_cli("--state-id", "h", cwd=tmp_path, input=stream(4))
    result = run_cli("--state-id", "h", "--state-file", "prior.json", cwd=tmp_path, input=b"")
    assert result.returncode == 0
    prior = tmp_path / "prior.json"
    assert json.loads(prior.read_bytes()) == {"bookmarks": {"s": {"replication_key_value": 4}}}
    assert prior.stat().st_mode & 0o777 == 0o600
    full = run_cli(
        "--state-id", "h", "--state-file", "prior.json", "--full-refresh", cwd=tmp_path, input=b""
    )
    assert full.returncode == 0
    assert json.loads(prior.read_bytes()) == {}


def test_integers_beyond_64_bits_are_kept_exactly(tmp_path: Path) -> None:
    """A bookmark of 2**64 or -2**63-1 is stored, handed back and shown digit for digit."""
    value = {"bookmarks": {"s": {"replication_key_value": 2**64, "low": -(2**63) - 1}}}
    result = run_cli("--state-id", "big", cwd=tmp_path, input=state_line(value))
    assert result.returncode == 0, result.stderr
    state_file = (store_of(tmp_path) / "big" / "state.json").read_text()
    assert "18446744073709551616" in state_file
    assert "-9223372036854775809" in state_file
    assert stored_state(store_of(tmp_path), "big") == value
    result = run_cli("--state-id", "big", "--state-file", "prior.json", cwd=tmp_path, input=b"")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "prior.json").read_bytes()) == value
    shown = run_cli("state", "get", "big", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == value
    bigger = {"bookmarks": {"s": {"replication_key_value": 10**30}}}
    set_ = run_cli("state", "set", "big", json.dumps(bigger), cwd=tmp_path)
    assert set_.returncode == 0, set_.stderr
    assert json.loads(run_cli("state", "get", "big", cwd=tmp_path).stdout) == bigger


def test_state_file_fifo_hands_the_prior_state_to_a_shell_pipeline(tmp_path: Path) -> None:
    """tap --state fifo | mapper-state --state-file fifo | target, as a shell runs it."""
    run_cli("--state-id", "fifo", cwd=tmp_path, input=stream(41))
    os.mkfifo(tmp_path / "state.fifo")
    # the "tap" echoes the state it received as a RECORD, then emits a new STATE
    tap = (
        "python3 -c 'import json,sys; s=json.load(open(sys.argv[1]));"
        ' print(json.dumps({"type":"RECORD","stream":"s","record":{"got":s}}));'
        ' print(json.dumps({"type":"STATE","value":{"n":42}}))\' state.fifo'
    )
    from tests.helpers import MAPPER

    script = f"set -o pipefail; {tap} | {MAPPER} --state-id fifo --state-file state.fifo | cat"
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, env=clean_env(), timeout=60
    )
    assert result.returncode == 0, result.stderr
    first = json.loads(result.stdout.splitlines()[0])
    assert first["record"]["got"] == {"bookmarks": {"s": {"replication_key_value": 41}}}
    assert stored_state(store_of(tmp_path), "fifo") == {"n": 42}


def test_failure_before_handoff_does_not_hang_the_tap(tmp_path: Path) -> None:
    """Lease busy: the FIFO is opened and closed empty, so the tap fails instead of hanging."""
    holder = spawn_cli("--state-id", "busy", cwd=tmp_path)
    wait_for_lease(store_of(tmp_path), "busy")
    os.mkfifo(tmp_path / "state.fifo")
    from tests.helpers import MAPPER

    tap = "python3 -c 'import json,sys; json.load(open(sys.argv[1]))' state.fifo"
    script = f"set -o pipefail; {tap} | {MAPPER} --state-id busy --state-file state.fifo | cat"
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, env=clean_env(), timeout=60
    )
    holder.communicate(b"")
    assert result.returncode != 0
    assert b"is busy" in result.stderr


def passed_first_state(
    tmp_path: Path, state_id: str, interval: str
) -> tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]:
    """A filter process that has passed its first state, ``{"n": 1}``, through; its stdin
    and stdout."""
    proc = spawn_cli(
        "--state-id", state_id, "--checkpoint-interval-seconds", interval, cwd=tmp_path
    )
    assert proc.stdin
    assert proc.stdout
    proc.stdin.write(state_line({"n": 1}))
    proc.stdin.flush()
    proc.stdout.readline()
    return proc, proc.stdin, proc.stdout


def wait_for_stored(tmp_path: Path, state_id: str, state: object, what: str) -> None:
    """Wait until the store in ``tmp_path`` holds ``state`` for ``state_id`` (``what`` names
    what did not happen otherwise)."""
    wait_until(lambda: stored_state(store_of(tmp_path), state_id) == state, what)


def test_checkpoints_are_written_while_running(tmp_path: Path) -> None:
    proc, stdin, _ = passed_first_state(tmp_path, "live", "0")
    wait_for_stored(tmp_path, "live", {"n": 1}, "no checkpoint while the stream was open")
    stdin.write(state_line({"n": 2}))
    stdin.close()
    assert proc.wait(10) == 0
    assert stored_state(store_of(tmp_path), "live") == {"n": 2}


def test_a_filter_writes_its_checkpoints_from_the_heartbeat_thread(tmp_path: Path) -> None:
    """A run starts one thread, the lease's heartbeat, which also writes the checkpoints: the
    filter works on two threads in all while it commits states and holds the lease."""
    proc, stdin, _ = passed_first_state(tmp_path, "threads", "0")
    wait_for_stored(tmp_path, "threads", {"n": 1}, "no checkpoint while the stream was open")
    stdin.write(state_line({"n": 2}))
    stdin.flush()
    wait_for_stored(tmp_path, "threads", {"n": 2}, "no second checkpoint while the stream was open")
    threads = len(os.listdir(f"/proc/{proc.pid}/task"))
    stdin.close()
    assert proc.wait(10) == 0
    assert threads == 2, f"the filter ran {threads} threads: the main thread and the heartbeat only"


def test_checkpoint_interval_throttles_writes(tmp_path: Path) -> None:
    proc = spawn_cli("--state-id", "slow", "--checkpoint-interval-seconds", "30", cwd=tmp_path)
    assert proc.stdin
    assert proc.stdout
    for n in range(1, 4):
        proc.stdin.write(state_line({"n": n}))
        proc.stdin.flush()
        proc.stdout.readline()
        time.sleep(0.3)
    # the first state is written at once, the later ones wait for the interval
    assert stored_state(store_of(tmp_path), "slow") == {"n": 1}
    proc.stdin.close()
    assert proc.wait(10) == 0
    assert stored_state(store_of(tmp_path), "slow") == {"n": 3}  # the last one, at EOF


def test_broken_downstream_pipe_stores_nothing_after_the_last_commit(tmp_path: Path) -> None:
    proc, stdin, stdout = passed_first_state(tmp_path, "bp", "3600")
    wait_for_stored(tmp_path, "bp", {"n": 1}, "the first checkpoint")
    stdout.close()  # the target dies
    try:
        for n in range(2, 200):
            stdin.write(state_line({"n": n}) + b"x" * 65536 + b"\n")
            stdin.flush()
    except BrokenPipeError:
        pass
    assert proc.wait(10) == 9
    assert b"closed its input" in proc.stderr.read()  # type: ignore[union-attr]
    assert stored_state(store_of(tmp_path), "bp") == {"n": 1}
    assert not (store_of(tmp_path) / "bp" / "mapper-state.lease.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signals_release_the_lease(tmp_path: Path, sig: signal.Signals) -> None:
    proc = spawn_cli("--state-id", "sig", cwd=tmp_path)
    wait_for_lease(store_of(tmp_path), "sig")
    proc.send_signal(sig)
    assert proc.wait(10) == 128 + sig
    assert not (store_of(tmp_path) / "sig" / "mapper-state.lease.json").exists()


@pytest.mark.parametrize(
    ("position", "kept"),
    [("before the target", {"n": 1}), ("after the target", {"n": 2})],
)
def test_what_a_signal_commits_with_a_state_pending(
    tmp_path: Path, position: str, kept: dict[str, int]
) -> None:
    """At-least-once: before the target a pending state is dropped; after it, committed."""
    after = position == "after the target"
    args = ["--state-id", "pending", "--checkpoint-interval-seconds", "60"]
    proc = spawn_cli(*args, *(["--after-target"] if after else []), cwd=tmp_path)
    assert proc.stdin is not None
    assert proc.stdout is not None

    def send(n: int) -> None:
        line = json.dumps({"n": n}).encode() + b"\n" if after else state_line({"n": n})
        proc.stdin.write(line)  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        assert proc.stdout.readline() == line  # type: ignore[union-attr]  # it passed through

    send(1)  # the first state is written at once
    wait_for_stored(tmp_path, "pending", {"n": 1}, "the first commit")
    send(2)  # the next waits for the checkpoint interval
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 143
    assert stored_state(store_of(tmp_path), "pending") == kept
    assert not (store_of(tmp_path) / "pending" / "mapper-state.lease.json").exists()


def test_a_state_equal_to_the_stored_one_is_not_written_again(tmp_path: Path) -> None:
    """Taps open by repeating the state they were given: that costs no write."""
    run_cli("--state-id", "same", cwd=tmp_path, input=stream(3))
    path = store_of(tmp_path) / "same" / "state.json"
    before = path.stat()
    snapshots = sorted((store_of(tmp_path) / ".mapper-state" / "history" / "same").iterdir())
    result = run_cli("--state-id", "same", cwd=tmp_path, input=stream(3))
    assert result.returncode == 0
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert (
        sorted((store_of(tmp_path) / ".mapper-state" / "history" / "same").iterdir()) == snapshots
    )
    assert b"commits=0" in result.stderr


@pytest.mark.parametrize(
    "bad",
    [["--state-id", "../x"], ["--state-id", "x", "--set", "state_backend.lock_timeout_seconds=no"]],
)
def test_bad_config_with_a_fifo_does_not_hang_the_tap(tmp_path: Path, bad: list[str]) -> None:
    os.mkfifo(tmp_path / "state.fifo")
    from tests.helpers import MAPPER

    tap = "python3 -c 'import json,sys; json.load(open(sys.argv[1]))' state.fifo"
    args = " ".join(f"'{a}'" for a in bad)
    script = f"set -o pipefail; {tap} | {MAPPER} {args} --state-file state.fifo | cat"
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, env=clean_env(), timeout=60
    )
    assert result.returncode == 2
    assert b"Traceback (most recent call last)" in result.stderr  # the tap's own failure
    assert b"mapper-state: error:" in result.stderr


def test_a_state_changed_behind_the_holders_back_stops_the_run_with_exit_4(
    tmp_path: Path,
) -> None:
    """Fencing through the CLI: another writer changes state.json without the lease."""
    args = ["--state-id", "fenced", "--checkpoint-interval-seconds", "0.2"]
    proc = spawn_cli(*args, cwd=tmp_path)
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(state_line({"n": 1}))
    proc.stdin.flush()
    wait_for_stored(tmp_path, "fenced", {"n": 1}, "the first commit")
    intruder = {"completed": {"singer_state": {"n": "intruder"}}, "partial": {}}
    (store_of(tmp_path) / "fenced" / "state.json").write_text(json.dumps(intruder))
    proc.stdin.write(state_line({"n": 2}))
    proc.stdin.flush()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 4, err
    assert b"changed by another writer" in err
    assert stored_state(store_of(tmp_path), "fenced") == {"n": "intruder"}  # not overwritten
    assert not (store_of(tmp_path) / "fenced" / "mapper-state.lease.json").exists()


def test_an_unreachable_store_is_exit_5_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = clean_env(AWS_ACCESS_KEY_ID="key", AWS_SECRET_ACCESS_KEY="secret-value-123")
    result = run_cli(
        "--state-id",
        "x",
        "--state-backend-uri",
        "s3://bucket/prefix",
        "--set",
        f"state_backend.s3.endpoint_url=http://127.0.0.1:{port}",
        "--lock-timeout-seconds",
        "3",
        input=state_line({"n": 1}),
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 5
    one_line_error(result.stderr, f"cannot reach S3 at http://127.0.0.1:{port}")


def test_sdk_debug_logging_hides_the_credentials(tmp_path: Path) -> None:
    """MAPPER_STATE_DEBUG=1 shows botocore's requests, with every secret hidden."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    key_id, secret = "AKIDEXAMPLE0SECRET7", "secret-access-key-value-9f3"
    common = ["state", "get", "x", "--state-backend-uri", "s3://bucket/prefix"]
    common += ["--set", f"state_backend.s3.endpoint_url=http://127.0.0.1:{port}"]
    common += ["--lock-timeout-seconds", "1"]
    from_env = clean_env(
        AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret, MAPPER_STATE_DEBUG="1"
    )
    from_flags = ["--set", f"state_backend.s3.aws_access_key_id={key_id}"]
    from_flags += ["--set", f"state_backend.s3.aws_secret_access_key={secret}"]
    for args, env in (
        (common, from_env),
        (common + from_flags, clean_env(MAPPER_STATE_DEBUG="1")),
    ):
        result = run_cli(*args, cwd=tmp_path, env=env)
        assert result.returncode == 5
        err = result.stderr.decode()
        assert "botocore" in err
        assert "Credential=***/" in err  # the debug log is there
        assert key_id not in err
        assert secret not in err


def test_the_filter_starts_without_the_subcommands_modules(tmp_path: Path) -> None:
    """The filter, the command run most, imports none of the subcommands' modules (each
    is imported when its command is looked up): it passes its input through, commits
    the state, and leaves them out of ``sys.modules``."""
    code = (
        "import json, sys\n"
        "from mapper_state.cli import SUBCOMMANDS, main\n"
        "try:\n"
        "    main(['--state-id', 'dev:x-to-y', '--state-backend-uri', sys.argv[1]])\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        "loaded = sorted(m for m, _ in SUBCOMMANDS.values() if m in sys.modules)\n"
        "print(json.dumps([code, loaded]), file=sys.stderr)\n"
    )
    line = b'{"type": "STATE", "value": {"bookmarks": {"s": {"id": 1}}}}\n'
    result = subprocess.run(
        [sys.executable, "-c", code, f"file://{tmp_path / 'store'}"],
        input=line,
        capture_output=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    assert result.stdout == line, result.stderr
    assert json.loads(result.stderr.decode().splitlines()[-1]) == [0, []], result.stderr
    assert (tmp_path / "store" / "dev:x-to-y" / "state.json").is_file()
