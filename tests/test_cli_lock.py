"""`mapper-state lock status` and `lock break` through the real command, on a file store."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mapper_state.core import state
from mapper_state.core.lease import LEASE_FILE, Lease, read_lease
from mapper_state.errors import LeaseLost
from mapper_state.stores.file import FileStore
from tests.helpers import in_terminal
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
    assert text.stdout == b"dev:tap-a-to-target-b: free (no lease)\n"
    doc = json.loads(mapper(tmp_path, "lock", "status", "job", "--format", "json").stdout)
    assert doc == {
        "state_id": "job",
        "status": "free",
        "free": True,
        "expired": False,
        "holder": None,
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
    assert (tmp_path / "dev:tap-a-to-target-b" / LEASE_FILE).exists()
    holder.confirm()  # still ours

    said_no = in_terminal(tmp_path, "lock", "break", "dev:tap-a-to-target-b", answer=b"n\n")
    assert said_no.returncode == 2
    assert b"nightly-7" in said_no.stderr
    assert b"still being renewed" in said_no.stderr
    holder.confirm()


def test_break_fences_the_old_holder(tmp_path: Path, holder: Lease) -> None:
    store = FileStore(tmp_path)
    version = state.save(store, "dev:tap-a-to-target-b", {"bookmarks": {"n": 1}}, None)
    result = mapper(tmp_path, "lock", "break", "dev:tap-a-to-target-b", "--yes")
    assert result.returncode == 0, result.stderr
    assert b"nightly-7" in result.stderr
    # broken by compare-and-swap to a broken record, safe where delete conditions are ignored
    broken, _ = read_lease(store, "dev:tap-a-to-target-b")
    assert broken is not None
    assert broken.status == "broken"
    assert broken.run_id == "nightly-7"
    status = mapper(tmp_path, "lock", "status", "dev:tap-a-to-target-b")
    assert status.stdout.endswith(b"free (no lease)\n")

    # the next run takes the lease; the old holder's next state write is refused
    successor = Lease(FileStore(tmp_path), "dev:tap-a-to-target-b", ttl=60, run_id="next")
    successor.acquire()
    with pytest.raises(LeaseLost):
        holder.confirm()
    assert state.load(store, "dev:tap-a-to-target-b").version == version
    successor.release()


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
    assert mapper(tmp_path, "lock", "break", "dev:tap-a-to-target-b", "--yes").returncode == 0
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
