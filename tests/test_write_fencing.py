"""A writer whose lease was broken writes nothing, even where the state itself never moved.

``mapper-state lock break`` frees a lease behind its holder's back; nobody else writes the
state, so a write conditional on the version of ``state.json`` the holder read would still
go through. Only the confirmation of the lease before each write can refuse it: these
tests hold that line in each place a write or a delete is confirmed (the one commit path,
the clear, a writer inside ``exec`` under the enclosing run's lease), and check that a
holder that learnt it lost its lease leaves the next holder's lease alone when it ends.
On the local file store, in this process: what is under test is the order of the calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mapper_state.core import commit, state
from mapper_state.core.inherited import EXEC, MELTANO_RUN, HeldLease, with_held
from mapper_state.core.lease import Lease, read_lease
from mapper_state.errors import ExitCode, LeaseLost
from mapper_state.stores.file import FileStore
from tests.support.cli import invoke
from tests.support.cli import invoke_on_store as mapper
from tests.support.processes import clean_env

STATE_ID = "dev:tap-a-to-target-b"
BEFORE = {"bookmarks": {"s": {"i": 1}}}


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Lease]:
    """A run holding the lease (60 s: no renewal between the break and its write)."""
    lease = Lease(FileStore(tmp_path), STATE_ID, ttl=60, run_id="nightly-7")
    lease.acquire()
    yield lease
    lease.release()


def break_it(root: Path, *flags: str) -> None:
    result = mapper(root, "lock", "break", STATE_ID, "--yes", *flags)
    assert result.returncode == 0, result.stderr


def test_a_commit_under_a_broken_lease_writes_nothing(tmp_path: Path, holder: Lease) -> None:
    store = FileStore(tmp_path)
    state.save(store, STATE_ID, BEFORE, None)
    prior = state.load(store, STATE_ID)  # read under the lease, as every writer does
    break_it(tmp_path)
    with pytest.raises(LeaseLost):
        commit.commit(store, holder, prior, {"bookmarks": {"s": {"i": 2}}}, commit.Options())
    after = state.load(store, STATE_ID)
    assert after.value == BEFORE
    assert after.version == prior.version  # the compare-and-swap alone would have passed


def test_a_clear_under_a_broken_lease_deletes_nothing(tmp_path: Path, holder: Lease) -> None:
    store = FileStore(tmp_path)
    state.save(store, STATE_ID, BEFORE, None)
    prior = state.load(store, STATE_ID)
    break_it(tmp_path)
    with pytest.raises(LeaseLost):
        commit.remove(store, holder, prior, commit.Options())
    assert state.load(store, STATE_ID).value == BEFORE


def test_a_write_inside_exec_after_its_lease_was_broken_writes_nothing(
    tmp_path: Path, holder: Lease
) -> None:
    """``state set`` inside ``exec`` writes under the enclosing run's lease: once that lease
    is broken, the write is refused (exit 4) and the state stays as it was."""
    held = HeldLease(STATE_ID, holder.run_id, FileStore(tmp_path).display_uri)
    env = with_held(held, clean_env())
    uri = ("--state-backend-uri", f"file://{tmp_path}")
    first = invoke("state", "set", STATE_ID, '{"bookmarks": {"s": {"i": 1}}}', *uri, env=env)
    assert first.returncode == 0, first.stderr  # under the enclosing run's lease: not busy
    break_it(tmp_path)
    second = invoke("state", "set", STATE_ID, '{"bookmarks": {"s": {"i": 2}}}', *uri, env=env)
    assert second.returncode == ExitCode.LEASE_LOST, second.stderr
    assert state.load(FileStore(tmp_path), STATE_ID).value == BEFORE


def test_a_holder_that_lost_its_lease_leaves_the_new_holders_alone(
    tmp_path: Path, holder: Lease
) -> None:
    """Broken, then taken by the next run: the old holder learns it at its next confirmation
    and, when it ends, releases nothing of the next run's lease (a forced break: the next
    run takes the lease at once)."""
    break_it(tmp_path, "--force")
    successor = Lease(FileStore(tmp_path), STATE_ID, ttl=60, run_id="nightly-8")
    successor.acquire()
    try:
        with pytest.raises(LeaseLost):
            holder.confirm()
        holder.release()
        record, _ = read_lease(FileStore(tmp_path), STATE_ID)
        assert record is not None
        assert (record.run_id, record.held) == ("nightly-8", True)
        status = mapper(tmp_path, "lock", "status", STATE_ID)
        assert b"nightly-8" in status.stdout, status.stdout
    finally:
        successor.release()


@pytest.mark.parametrize("who", [MELTANO_RUN, EXEC])
def test_a_refused_write_under_an_inherited_lease_says_whose_lease_it_was(
    tmp_path: Path, holder: Lease, who: str
) -> None:
    """The refusal names the enclosing run that held the lease, and names ``exec`` only
    when it was exec's (a forced break: no run winds down under it)."""
    held = HeldLease(STATE_ID, holder.run_id, FileStore(tmp_path).display_uri, who)
    env = with_held(held, clean_env())
    break_it(tmp_path, "--force")
    uri = ("--state-backend-uri", f"file://{tmp_path}")
    refused = invoke("state", "set", STATE_ID, '{"bookmarks": {}}', *uri, env=env)
    assert refused.returncode == ExitCode.LEASE_LOST, refused.stderr
    said = refused.stderr.decode()
    assert f"of the enclosing run {holder.run_id} ({who}) is gone" in said, said
    assert (EXEC in said) == (who == EXEC), said
    assert f"in file://{tmp_path}" in said, said


@pytest.mark.parametrize("who", [MELTANO_RUN, EXEC])
def test_only_a_meltano_run_writes_while_it_winds_down_under_its_broken_lease(
    tmp_path: Path, holder: Lease, who: str
) -> None:
    """After a plain ``lock break`` a Meltano run winds down (its extractors stopped first),
    so the state its loader confirms is still written under the broken lease until its
    renewal deadline, before which no other run may take it; ``exec``, which cannot tell
    its command's steps apart, is refused at once."""
    held = HeldLease(STATE_ID, holder.run_id, FileStore(tmp_path).display_uri, who)
    env = with_held(held, clean_env())
    state.save(FileStore(tmp_path), STATE_ID, BEFORE, None)
    break_it(tmp_path)
    uri = ("--state-backend-uri", f"file://{tmp_path}")
    after = {"bookmarks": {"s": {"i": 2}}}
    wrote = invoke("state", "set", STATE_ID, json.dumps(after), *uri, env=env)
    if who == MELTANO_RUN:
        assert wrote.returncode == 0, wrote.stderr
        assert state.load(FileStore(tmp_path), STATE_ID).value == after
        busy = mapper(tmp_path, "lock", "status", STATE_ID)
        assert b"broken, its holder may still be running" in busy.stdout, busy.stdout
    else:
        assert wrote.returncode == ExitCode.LEASE_LOST, wrote.stderr
        assert state.load(FileStore(tmp_path), STATE_ID).value == BEFORE
