"""`mapper-state state ...` through the real command, on a local-file store in a temp dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mapper_state.core.lease import Lease
from mapper_state.ops import commands as ops
from mapper_state.stores.file import FileStore
from tests.helpers import MAPPER, in_terminal
from tests.helpers import clean_env as env
from tests.support.cli import invoke_on_store as mapper
from tests.support.cli import one_line_error

REPO = Path(__file__).resolve().parents[1]
TERMS = ops.WriteTerms(ttl=30, retry=1, wait=0, history_keep=20)
STATE = {"bookmarks": {"users": {"replication_key_value": "2024-01-01"}, "orders": {"id": 7}}}


def stored(store: Path, state_id: str) -> Any:
    """Meltano's part of the stored document (without mapper-state's writer record)."""
    path = store / state_id / "state.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_bytes())
    writer = doc.pop("mapper_state")
    assert writer["serial"] >= 1
    assert writer["run_id"]  # every write's bytes are unique
    return doc


def put(store: Path, state_id: str, value: object) -> None:
    """Arrange a state as `state set` would, without the cost of a process."""
    ops.set_state(FileStore(store), state_id, value, TERMS)


# -- get and set ---------------------------------------------------------------------


def test_get_prints_the_bare_state_and_set_get_round_trips_byte_for_byte(tmp_path: Path) -> None:
    put(tmp_path, "dev:tap-a-to-target-b", STATE)
    assert stored(tmp_path, "dev:tap-a-to-target-b") == {
        "completed": {"singer_state": STATE},
        "partial": {},
    }  # Meltano's document, so `meltano state get` reads it
    for fmt in ("text", "json"):
        first = mapper(tmp_path, "state", "get", "dev:tap-a-to-target-b", "--format", fmt)
        assert first.returncode == 0
        assert json.loads(first.stdout) == STATE
        again = mapper(tmp_path, "state", "set", "dev:tap-a-to-target-b", input=first.stdout)
        assert again.returncode == 0, again.stderr
        second = mapper(tmp_path, "state", "get", "dev:tap-a-to-target-b", "--format", fmt)
        assert second.stdout == first.stdout
    compact = mapper(tmp_path, "state", "get", "dev:tap-a-to-target-b", "--format", "json")
    assert compact.stdout.count(b"\n") == 1


def test_get_works_as_a_taps_state_file(tmp_path: Path) -> None:
    put(tmp_path, "job", STATE)
    tap = "import json, sys; print(json.load(open(sys.argv[1]))['bookmarks']['orders']['id'])"
    script = (
        f'{sys.executable} -c "{tap}" <({MAPPER} state get job '
        f"--state-backend-uri file://{tmp_path})"
    )
    result = subprocess.run(["bash", "-c", script], capture_output=True, env=env(), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"7\n"


def test_meltano_shape_on_get_and_set(tmp_path: Path) -> None:
    put(tmp_path, "job", STATE)
    got = mapper(tmp_path, "state", "get", "job", "--meltano", "--format", "json")
    assert json.loads(got.stdout) == {"singer_state": STATE}
    new = {"singer_state": {"bookmarks": {"users": {"replication_key_value": "2025"}}}}
    assert mapper(tmp_path, "state", "set", "job", "--meltano", json.dumps(new)).returncode == 0
    assert stored(tmp_path, "job")["completed"]["singer_state"] == new["singer_state"]

    wrong = mapper(tmp_path, "state", "set", "job", json.dumps({"singer_state": STATE}))
    assert wrong.returncode == 6
    assert "add --meltano" in one_line_error(wrong.stderr)
    bare = mapper(tmp_path, "state", "set", "job", "--meltano", json.dumps(STATE))
    assert bare.returncode == 6
    assert "singer_state" in one_line_error(bare.stderr)
    assert stored(tmp_path, "job")["completed"]["singer_state"] == new["singer_state"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ('{"bookmarks": ', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("", "not valid JSON"),
    ],
)
def test_bad_input_leaves_the_state_untouched(tmp_path: Path, given: str, expected: str) -> None:
    put(tmp_path, "job", STATE)
    before = (tmp_path / "job" / "state.json").read_bytes()
    for command in ("set", "merge"):
        result = mapper(tmp_path, "state", command, "job", "-", input=given.encode())
        assert result.returncode == 6
        assert expected in one_line_error(result.stderr)
    assert (tmp_path / "job" / "state.json").read_bytes() == before


def test_a_file_name_instead_of_json_gets_a_hint(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps(STATE))
    result = subprocess.run(
        [MAPPER, "state", "set", "job", "state.json", "--state-backend-uri", "file://store"],
        cwd=tmp_path,
        capture_output=True,
        env=env(),
        check=False,
    )
    assert result.returncode == 6
    assert "give - and `< state.json`" in one_line_error(result.stderr)


def test_unknown_state_id_is_not_found(tmp_path: Path) -> None:
    put(tmp_path, "other", STATE)
    for args in (
        ("get", "missing"),
        ("merge", "missing", "{}"),
        ("clear", "missing"),
        ("copy", "missing", "x"),
        ("move", "missing", "x"),
        ("history", "missing"),
    ):
        result = mapper(tmp_path, "state", *args)
        assert result.returncode == 10, (args, result.stderr)
        assert "missing not found" in one_line_error(result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mapper-state", "other"]
    assert [p.name for p in (tmp_path / ".mapper-state" / "history").iterdir()] == ["other"]


@pytest.mark.parametrize("bad", ["../escape", "a//b", "/abs", ".mapper-state-doctor/x"])
def test_invalid_and_reserved_state_ids_are_refused(tmp_path: Path, bad: str) -> None:
    result = mapper(tmp_path, "state", "set", bad, "{}")
    assert result.returncode == 2
    one_line_error(result.stderr)
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_merge_deep_merges_over_the_stored_state(tmp_path: Path) -> None:
    put(tmp_path, "job", STATE)
    change = {"bookmarks": {"users": {"replication_key_value": "2024-06-01"}, "new": {"id": 1}}}
    assert mapper(tmp_path, "state", "merge", "job", json.dumps(change)).returncode == 0
    assert stored(tmp_path, "job")["completed"]["singer_state"] == {
        "bookmarks": {
            "users": {"replication_key_value": "2024-06-01"},
            "orders": {"id": 7},
            "new": {"id": 1},
        }
    }


# -- list ----------------------------------------------------------------------------


def test_list_shows_state_ids_only(tmp_path: Path) -> None:
    for state_id in ("dev:tap-a-to-target-b", "prod:tap-a-to-target-b", "team/nightly"):
        put(tmp_path, state_id, STATE)
    store = FileStore(tmp_path)
    lease = Lease(store, "dev:tap-a-to-target-b", ttl=30)
    lease.acquire()
    store.create(".mapper-state-doctor/x/state.json", b"{}")  # never a state ID
    store.create("team/nightly/lock", b"")  # Meltano's own lock file
    try:
        listed = mapper(tmp_path, "state", "list")
        assert listed.stdout.decode().splitlines() == [
            "dev:tap-a-to-target-b",
            "prod:tap-a-to-target-b",
            "team/nightly",
        ]
        as_json = mapper(tmp_path, "state", "list", "--format", "json", "--pattern", "*:tap-a-*")
        assert json.loads(as_json.stdout) == ["dev:tap-a-to-target-b", "prod:tap-a-to-target-b"]
        dev = mapper(tmp_path, "state", "list", "--pattern", "dev:*")
        assert dev.stdout == b"dev:tap-a-to-target-b\n"
    finally:
        lease.release()
    empty = mapper(tmp_path / "empty", "state", "list")
    assert empty.returncode == 0
    assert empty.stdout == b""
    assert b"no states" in empty.stderr


# -- writes take the lease -----------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("set", "job", '{"x": 1}'),
        ("merge", "job", '{"x": 1}'),
        ("clear", "job"),
        ("copy", "other", "job", "--force"),
        ("move", "other", "job", "--force"),
        ("clear", "--all", "--yes"),
        ("import", "--force"),
        ("rollback", "job", "--to", "2"),
        ("set", "job", "--stream", "users", '{"x": 1}'),
        ("clear", "job", "--stream", "users"),
    ],
)
def test_writes_fail_while_a_run_holds_the_lease(tmp_path: Path, args: tuple[str, ...]) -> None:
    put(tmp_path, "job", STATE)
    put(tmp_path, "other", {"bookmarks": {}})
    before = (tmp_path / "job" / "state.json").read_bytes()
    holder = Lease(FileStore(tmp_path), "job", ttl=30, run_id="nightly-run-42")
    holder.acquire()
    try:
        lines = (
            b'{"state_id": "other", "singer_state": {}}\n{"state_id": "job", "singer_state": {}}'
        )
        result = mapper(tmp_path, "state", *args, input=lines)
    finally:
        holder.release()
    assert result.returncode == 3
    err = one_line_error(result.stderr)
    assert "job" in err
    assert "nightly-run-42" in err
    assert f"pid {os.getpid()}" in err
    assert (tmp_path / "job" / "state.json").read_bytes() == before
    assert stored(tmp_path, "other")["completed"]["singer_state"] == {"bookmarks": {}}


def test_writes_wait_for_the_lease_when_asked(tmp_path: Path) -> None:
    put(tmp_path, "job", STATE)
    holder = Lease(FileStore(tmp_path), "job", ttl=30)
    holder.acquire()
    proc = subprocess.Popen(
        [
            *(MAPPER, "state", "set", "job", '{"x": 2}'),
            *("--state-backend-uri", f"file://{tmp_path}"),
            *("--lock-wait-seconds", "20", "--lock-retry-seconds", "0.05"),
        ],
        stderr=subprocess.PIPE,
        env=env(),
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        assert stored(tmp_path, "job")["completed"]["singer_state"] == STATE
    finally:
        holder.release()
    assert proc.wait(timeout=20) == 0
    assert stored(tmp_path, "job")["completed"]["singer_state"] == {"x": 2}


# -- clear ---------------------------------------------------------------------------


def test_clear_keeps_the_history_so_it_can_be_undone(tmp_path: Path) -> None:
    put(tmp_path, "job", STATE)
    cleared = mapper(tmp_path, "state", "clear", "job")
    assert cleared.returncode == 0, cleared.stderr
    assert mapper(tmp_path, "state", "get", "job").returncode == 10
    assert mapper(tmp_path, "state", "list").stdout == b""
    hint = cleared.stderr.decode().split("`")[1]
    assert hint.startswith("mapper-state state rollback job --to ")
    undo = mapper(tmp_path, *hint.split()[1:])
    assert undo.returncode == 0, undo.stderr
    assert json.loads(mapper(tmp_path, "state", "get", "job").stdout) == STATE


def test_clear_with_history_asks_first_and_removes_everything(tmp_path: Path) -> None:
    put(tmp_path, "job", STATE)
    refused = mapper(tmp_path, "state", "clear", "job", "--history")
    assert refused.returncode == 2
    assert "--yes" in one_line_error(refused.stderr)
    assert stored(tmp_path, "job") is not None
    done = mapper(tmp_path, "state", "clear", "job", "--history", "--yes")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "job").exists()
    assert mapper(tmp_path, "state", "history", "job").returncode == 10


def test_clear_all_needs_confirmation(tmp_path: Path) -> None:
    for state_id in ("dev:a", "dev:b", "prod:a"):
        put(tmp_path, state_id, STATE)
    refused = mapper(tmp_path, "state", "clear", "--all")
    assert refused.returncode == 2
    assert "not a terminal" in one_line_error(refused.stderr)
    said_no = in_terminal(tmp_path, "state", "clear", "--all", answer=b"n\n")
    assert said_no.returncode == 2
    assert b"Clear 3 states" in said_no.stderr
    assert mapper(tmp_path, "state", "list").stdout.count(b"\n") == 3
    said_yes = in_terminal(tmp_path, "state", "clear", "--all", "--pattern", "dev:*", answer=b"y\n")
    assert said_yes.returncode == 0, said_yes.stderr
    assert mapper(tmp_path, "state", "list").stdout == b"prod:a\n"
    assert mapper(tmp_path, "state", "clear", "--all", "--yes").returncode == 0
    assert mapper(tmp_path, "state", "list").stdout == b""


def test_clear_needs_an_id_or_all(tmp_path: Path) -> None:
    result = mapper(tmp_path, "state", "clear")
    assert result.returncode == 2
    assert b"give a state ID or --all" in result.stderr


# -- copy and move -------------------------------------------------------------------


def test_copy_and_move(tmp_path: Path) -> None:
    put(tmp_path, "a", STATE)
    put(tmp_path, "b", {"bookmarks": {}})
    assert mapper(tmp_path, "state", "copy", "a", "c").returncode == 0
    assert stored(tmp_path, "c") == stored(tmp_path, "a")

    onto = mapper(tmp_path, "state", "copy", "a", "b")
    assert onto.returncode == 6
    assert "--force" in one_line_error(onto.stderr)
    assert stored(tmp_path, "b")["completed"]["singer_state"] == {"bookmarks": {}}

    moved = mapper(tmp_path, "state", "move", "c", "d")
    assert moved.returncode == 0, moved.stderr
    assert stored(tmp_path, "c") is None
    assert stored(tmp_path, "d")["completed"]["singer_state"] == STATE

    refused = mapper(tmp_path, "state", "move", "d", "b")
    assert refused.returncode == 6
    assert "b exists already" in one_line_error(refused.stderr)
    assert stored(tmp_path, "d") is not None
    assert stored(tmp_path, "b")["completed"]["singer_state"] == {"bookmarks": {}}

    forced = mapper(tmp_path, "state", "move", "d", "b", "--force")
    assert forced.returncode == 0
    assert stored(tmp_path, "d") is None
    assert stored(tmp_path, "b")["completed"]["singer_state"] == STATE
    assert mapper(tmp_path, "state", "list").stdout.decode().split() == ["a", "b"]

    same = mapper(tmp_path, "state", "move", "a", "a")
    assert same.returncode == 6
    assert "same state ID" in one_line_error(same.stderr)


# -- export and import ---------------------------------------------------------------


def test_export_then_import_into_another_store(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    states = {"dev:a": STATE, "dev:b": {"bookmarks": {"x": {"v": 1}}}, "team/c": {}}
    for state_id, value in states.items():
        put(old, state_id, value)
    exported = mapper(old, "state", "export")
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert lines == [{"state_id": k, "singer_state": v} for k, v in sorted(states.items())]

    imported = mapper(new, "state", "import", "-", input=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    assert b"imported 3 states" in imported.stderr
    assert mapper(new, "state", "export").stdout == exported.stdout

    again = mapper(new, "state", "import", input=exported.stdout)
    assert again.returncode == 6
    assert "3 of these states exist already" in one_line_error(again.stderr)
    (tmp_path / "backup.jsonl").write_bytes(exported.stdout)
    put(new, "dev:a", {"bookmarks": {}})
    restored = mapper(new, "state", "import", str(tmp_path / "backup.jsonl"), "--force")
    assert restored.returncode == 0, restored.stderr
    assert stored(new, "dev:a")["completed"]["singer_state"] == STATE


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"state_id": "a", "singer_state": {}}\n\n{"state_id": "b", "singer_s', "line 3 is not"),
        ('{"state_id": "a", "singer_state": {}}\n{"state_id": "b"}', "line 2: no singer_state"),
        ('{"state_id": "a", "singer_state": {}}\n{"singer_state": {}}', "line 2: no state_id"),
        ('{"state_id": "a", "singer_state": {}}\n{"state_id": "a", "singer_state": {}}', "twice"),
        ('{"state_id": "../x", "singer_state": {}}', "line 1: state ID '../x'"),
        ('{"state_id": "a", "singer_state": [1]}', "line 1: singer_state must be"),
        ("{}", "meltano state get"),
    ],
)
def test_import_checks_every_line_before_writing(tmp_path: Path, text: str, message: str) -> None:
    result = mapper(tmp_path, "state", "import", input=text.encode())
    assert result.returncode == 6
    assert message in one_line_error(result.stderr)
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_import_meltano_state_get_and_export_output(tmp_path: Path) -> None:
    # exactly what `meltano state get ID` prints (compact, then --format pretty)
    got = json.dumps({"singer_state": STATE}, separators=(",", ":"))
    result = mapper(tmp_path, "state", "import", "--state-id", "dev:x", input=got.encode())
    assert result.returncode == 0, result.stderr
    assert stored(tmp_path, "dev:x")["completed"]["singer_state"] == STATE
    pretty = json.dumps({"singer_state": {"bookmarks": {}}}, indent=2).encode()
    result = mapper(tmp_path, "state", "import", "--state-id", "dev:y", input=pretty)
    assert result.returncode == 0, result.stderr
    assert stored(tmp_path, "dev:y")["completed"]["singer_state"] == {"bookmarks": {}}
    # what `meltano state export` prints: one object, state ID -> document
    export = {
        "dev:z": {"completed": {"singer_state": STATE}, "partial": {}},
        "dev:w": {"completed": {}, "partial": {"singer_state": {"bookmarks": {"p": 1}}}},
    }
    result = mapper(tmp_path, "state", "import", input=json.dumps(export).encode())
    assert result.returncode == 0, result.stderr
    assert stored(tmp_path, "dev:z")["completed"]["singer_state"] == STATE
    assert stored(tmp_path, "dev:w")["completed"]["singer_state"] == {"bookmarks": {"p": 1}}
    ours = mapper(tmp_path, "state", "export", "--meltano", "--pattern", "dev:[zy]")
    assert json.loads(ours.stdout) == {
        "dev:y": {"completed": {"singer_state": {"bookmarks": {}}}, "partial": {}},
        "dev:z": {"completed": {"singer_state": STATE}, "partial": {}},
    }


@pytest.mark.e2e
def test_migrating_from_meltano_with_the_real_meltano(tmp_path: Path) -> None:
    meltano = REPO / ".tools" / "meltano" / "bin" / "meltano"
    assert meltano.exists(), "meltano is missing: run `scripts/install-tools.sh`"
    project = tmp_path / "project"
    project.mkdir()
    (project / "meltano.yml").write_text(
        "version: 1\nproject_id: mapper-state-test\ndefault_environment: dev\n"
        "environments:\n- name: dev\n"
    )
    meltano_store = tmp_path / "meltano-store"
    menv = {
        **env(),
        "MELTANO_STATE_BACKEND_URI": f"file://{meltano_store}",
        "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false",
    }
    value = json.dumps({"singer_state": STATE})
    subprocess.run(
        [str(meltano), "state", "set", "--force", "dev:tap-a-to-target-b", value],
        cwd=project,
        env=menv,
        check=True,
        capture_output=True,
    )
    printed = subprocess.run(
        [str(meltano), "state", "get", "dev:tap-a-to-target-b"],
        cwd=project,
        env=menv,
        check=True,
        capture_output=True,
    ).stdout
    ours = tmp_path / "ours"
    result = mapper(ours, "state", "import", "--state-id", "dev:tap-a-to-target-b", input=printed)
    assert result.returncode == 0, result.stderr
    assert json.loads(mapper(ours, "state", "get", "dev:tap-a-to-target-b").stdout) == STATE
    # and Meltano lists what mapper-state wrote, history and all, as exactly one state ID
    listed = subprocess.run(
        [str(meltano), "state", "list"],
        cwd=project,
        env={**menv, "MELTANO_STATE_BACKEND_URI": f"file://{ours}"},
        check=True,
        capture_output=True,
    ).stdout
    assert listed.split() == [b"dev:tap-a-to-target-b"]
