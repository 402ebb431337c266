"""`mapper-state lock status` and `lock break` through the real command, on a file store."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from mapper_state.core import state
from mapper_state.core.lease import LEASE_FILE, Lease, format_time, read_lease
from mapper_state.errors import LeaseBusy, LeaseLost
from mapper_state.stores.file import FileStore
from tests.helpers import in_terminal, run_cli
from tests.support.cli import invoke_on_store as mapper


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Lease]:
    lease = Lease(FileStore(tmp_path), "dev:tap-a-to-target-b", ttl=60, run_id="nightly-7")
    lease.acquire()
    yield lease
    lease.release()


def test_status_of_a_free_state_id(tmp_path: Path) -> None:
    text = mapper(tmp_path, "lock", "status", "dev:tap-a-to-target-b")
    assert text.returncode == 0
    assert (
        text.stdout
        == (
            f"dev:tap-a-to-target-b: free (no lease)\n"
            f"  store     file://{tmp_path} (from the command line)\n"
        ).encode()
    )
    doc = json.loads(mapper(tmp_path, "lock", "status", "job", "--format", "json").stdout)
    assert doc == {
        "state_id": "job",
        "status": "free",
        "free": True,
        "expired": False,
        "holder": None,
        "store": f"file://{tmp_path}",
        "store_from": "the command line",
    }


def test_status_names_the_holder(tmp_path: Path, holder: Lease) -> None:
    text = mapper(tmp_path, "lock", "status", "dev:tap-a-to-target-b")
    assert text.returncode == 0
    out = text.stdout.decode()
    assert out.startswith("dev:tap-a-to-target-b: held, expires in ")
    for label, value in (
        ("run id", "nightly-7"),
        ("host", socket.gethostname()),
        ("pid", str(os.getpid())),
    ):
        assert f"  {label:<9} {value}\n" in out
    for label in ("acquired", "renewed", "expires"):
        assert f"  {label:<9} 20" in out
    doc = json.loads(
        mapper(tmp_path, "lock", "status", "dev:tap-a-to-target-b", "--format", "json").stdout
    )
    assert doc["status"] == "held"
    assert doc["free"] is False
    assert doc["expired"] is False
    assert doc["holder"]["run_id"] == "nightly-7"
    assert doc["holder"]["pid"] == os.getpid()
    assert doc["holder"]["host"] == socket.gethostname()
    assert doc["holder"]["ttl_seconds"] == 60
    assert doc["holder"]["expires_at"].endswith("Z")


def test_status_of_an_expired_lease(tmp_path: Path) -> None:
    crashed = Lease(FileStore(tmp_path), "job", ttl=0.5, run_id="crashed-run")
    crashed.acquire()  # never renewed nor released, like a killed run
    time.sleep(0.8)
    text = mapper(tmp_path, "lock", "status", "job")
    assert text.stdout.startswith(b"job: free: the lease expired ")
    assert b"crashed-run" in text.stdout
    doc = json.loads(mapper(tmp_path, "lock", "status", "job", "--format", "json").stdout)
    assert doc["status"] == "expired"
    assert doc["free"] is True
    assert doc["expired"] is True


def test_break_is_refused_without_confirmation(tmp_path: Path, holder: Lease) -> None:
    result = mapper(tmp_path, "lock", "break", "dev:tap-a-to-target-b")
    assert result.returncode == 2
    assert b"--yes" in result.stderr
    assert b"Traceback" not in result.stderr
    # a script is told, in its one line, what it was about to break: a live holder here
    assert result.stderr.count(b"\n") == 1, result.stderr
    assert f"Its pid {os.getpid()} is running on this host".encode() in result.stderr
    assert (tmp_path / "dev:tap-a-to-target-b" / LEASE_FILE).exists()
    holder.confirm()  # still ours

    said_no = in_terminal(tmp_path, "lock", "break", "dev:tap-a-to-target-b", answer=b"n\n")
    assert said_no.returncode == 2
    assert b"nightly-7" in said_no.stderr
    assert b"still being renewed" in said_no.stderr
    assert f"Its pid {os.getpid()} is running on this host".encode() in said_no.stderr
    holder.confirm()


def test_break_fences_the_old_holder(tmp_path: Path, holder: Lease) -> None:
    """A break of a live holder does not free the lease at once: the holder is fenced out
    (its next write refused) and the lease stays taken until it has stopped or its renewal
    deadline has passed, so that no other run overlaps it."""
    store = FileStore(tmp_path)
    version = state.save(store, "dev:tap-a-to-target-b", {"bookmarks": {"n": 1}}, None)
    assert holder.record is not None
    deadline = holder.record.expires_at
    result = mapper(tmp_path, "lock", "break", "dev:tap-a-to-target-b", "--yes")
    assert result.returncode == 0, result.stderr
    said = result.stderr.decode()
    assert "nightly-7" in said
    assert f"in store file://{tmp_path} (from the command line)" in said
    assert f"free once it has stopped, at the latest {format_time(deadline + 2)}" in said
    # broken by compare-and-swap to a broken record, safe where delete conditions are ignored
    broken, _ = read_lease(store, "dev:tap-a-to-target-b")
    assert broken is not None
    assert broken.status == "broken"
    assert broken.run_id == "nightly-7"
    assert broken.free_at == deadline
    status = mapper(tmp_path, "lock", "status", "dev:tap-a-to-target-b")
    assert b": broken, its holder may still be running: free once it has stopped" in status.stdout

    # the next run is refused while the broken holder may still run; its writes are refused
    successor = Lease(FileStore(tmp_path), "dev:tap-a-to-target-b", ttl=60, run_id="next")
    with pytest.raises(LeaseBusy, match="may run until it has stopped"):
        successor.acquire()
    with pytest.raises(LeaseLost):
        holder.confirm()
    assert state.load(store, "dev:tap-a-to-target-b").version == version


def test_a_forced_break_frees_the_lease_at_once(tmp_path: Path) -> None:
    dead = Lease(FileStore(tmp_path), "job", ttl=60, run_id="crashed")
    dead.acquire()  # its holder is this test's process: alive here, so --force asks --yes
    refused = mapper(tmp_path, "lock", "break", "job", "--force")
    assert refused.returncode == 2
    assert refused.stderr.count(b"\n") == 1, refused.stderr
    assert b"is running on this host" in refused.stderr
    assert read_lease(FileStore(tmp_path), "job")[0].held  # type: ignore[union-attr]
    result = mapper(tmp_path, "lock", "break", "job", "--force", "--yes")
    assert result.returncode == 0, result.stderr
    assert b"free now" in result.stderr
    successor = Lease(FileStore(tmp_path), "job", ttl=60, run_id="next")
    successor.acquire()  # at once
    with pytest.raises(LeaseLost):
        dead.confirm()
    successor.release()


def test_a_holder_whose_pid_is_gone_here_is_said_to_be(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    lease = Lease(FileStore(tmp_path), "job", ttl=60, run_id="crashed")
    lease.acquire()
    record = lease.record
    assert record is not None
    # a crashed run's record: its pid no longer runs on this host
    (tmp_path / "job" / LEASE_FILE).write_bytes(replace(record, pid=gone.pid).to_bytes())
    note = f"pid {gone.pid} is not running on host {socket.gethostname()}: `mapper-state lock break` it"
    status = mapper(tmp_path, "lock", "status", "job")
    assert note.encode() in status.stdout
    busy = mapper(tmp_path, "state", "set", "job", "{}")
    assert busy.returncode == 3
    assert note.encode() in busy.stderr
    asked = in_terminal(tmp_path, "lock", "break", "job", answer=b"n\n")
    assert f"Its pid {gone.pid} is not running on this host".encode() in asked.stderr
    broke = mapper(tmp_path, "lock", "break", "job", "--yes")  # it has stopped: free at once
    assert b"free now" in broke.stderr, broke.stderr
    Lease(FileStore(tmp_path), "job", ttl=60, run_id="next").acquire()


def test_status_and_break_outside_a_project_name_the_default_store(tmp_path: Path) -> None:
    for args in (("lock", "status", "job"), ("lock", "break", "job")):
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        said = (result.stdout + result.stderr).decode()
        assert "file://.mapper-state" in said, said
        assert "the default" in said, said


def test_break_after_confirming_at_a_terminal(tmp_path: Path, holder: Lease) -> None:
    result = in_terminal(tmp_path, "lock", "break", "dev:tap-a-to-target-b", answer=b"y\n")
    assert result.returncode == 0, result.stderr
    assert b"Break the lease on dev:tap-a-to-target-b" in result.stderr
    with pytest.raises(LeaseLost):
        holder.confirm()


def test_break_of_a_free_lease_has_nothing_to_do(tmp_path: Path) -> None:
    result = mapper(tmp_path, "lock", "break", "job")
    assert result.returncode == 0
    assert b"nothing to break" in result.stderr


def test_a_state_write_after_break_goes_through(tmp_path: Path, holder: Lease) -> None:
    busy = mapper(tmp_path, "state", "set", "dev:tap-a-to-target-b", "{}")
    assert busy.returncode == 3
    forced = mapper(tmp_path, "lock", "break", "dev:tap-a-to-target-b", "--force", "--yes")
    assert forced.returncode == 0
    done = mapper(tmp_path, "state", "set", "dev:tap-a-to-target-b", '{"b": 1}')
    assert done.returncode == 0, done.stderr
    assert state.load(FileStore(tmp_path), "dev:tap-a-to-target-b").value == {"b": 1}


def test_the_command_line_kept_in_the_lease_and_history_hides_secrets(tmp_path: Path) -> None:
    """A secret given on the command line is neither stored with the lease or the history
    nor shown by `lock status`, even where it would be cut at the record's length limit."""
    from tests.helpers import spawn_cli, state_line, wait_for_lease

    secret = "hunter2-" + "s" * 190  # reaches past the 200 characters a record keeps
    flags = ("--state-backend-uri", f"file://{tmp_path}", "--set")
    holder = spawn_cli("--state-id", "sec", *flags, f"state_backend.postgres.password={secret}")
    record = wait_for_lease(tmp_path, "sec")
    assert "***" in record["command"]
    assert "hunter2" not in record["command"]
    for fmt in ("text", "json"):
        shown = mapper(tmp_path, "lock", "status", "sec", "--format", fmt)
        assert b"***" in shown.stdout
        assert b"hunter2" not in shown.stdout
    holder.communicate(state_line({"x": 1}), timeout=30)
    assert holder.returncode == 0
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert b"hunter2" not in stored
