"""The real Meltano 4.4.1 running mapper-state as a mapping, on the local store and on S3.

Each test copies the repository's meltano.yml into a throw-away project (executables
made absolute, so no `meltano install` is needed), runs `meltano` from a subdirectory of
it (Meltano starts plugins in its own cwd, not the project root) and checks what a user
would: the rows the target received, what `meltano state get` and `mapper-state state
get` print, what a second run of the same pipeline does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import tools
from tests.helpers import clean_env
from tests.support import lease, meltano_fork

pytestmark = pytest.mark.e2e

REPO = tools.REPO_ROOT
PIPELINE = ("tap-sample", "remote-state", "target-jsonl")
STATE_ID = "dev:tap-sample-to-target-jsonl"
LEASE = "mapper-state.lease.json"
GENERATE = REPO / "examples" / "generate_data.py"


# -- data ------------------------------------------------------------------------------


def add_rows(data: Path, rows: int) -> None:
    subprocess.run(
        [sys.executable, str(GENERATE), "--file", str(data), "--rows", str(rows), "--quiet"],
        check=True,
    )


def rows_of(data: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.read_text().splitlines() if line.strip()]


def bookmark(data: Path, row_id: int) -> dict[str, Any]:
    """tap-sample's state after it emitted row ``row_id``."""
    row = next(r for r in rows_of(data) if r["id"] == row_id)
    value = {"replication_key": "updated_at", "replication_key_value": row["updated_at"]}
    return {"bookmarks": {"events": value}}


def delivered(output: Path) -> list[int]:
    """The ids target-jsonl wrote, in order, across runs (it appends)."""
    path = output / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]


# -- a Meltano project -----------------------------------------------------------------------


def _absolute(executable: str) -> str:
    """The repository's relative executables, as absolute paths (failing if missing)."""
    parts = Path(executable).parts
    if parts[:2] == (".venv", "bin"):
        return str(tools.project_bin(parts[2]))
    if parts[0] == ".tools":
        return str(tools.require_tool(parts[1], parts[3]))
    return executable


@dataclass
class Project:
    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def cwd(self) -> Path:
        return self.root / "elsewhere"  # where `meltano` is started from

    @property
    def output(self) -> Path:
        return self.root / "output"

    def executable(self) -> Path:
        """The ``meltano`` this project runs."""
        return tools.meltano()

    def meltano(
        self, *args: str, input: bytes | None = None, timeout: float = 120, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return meltano_fork.run(
            self.executable(), args, cwd=self.cwd, env={**self.env, **env}, input=input,
            timeout=timeout,
        )  # fmt: skip

    def spawn(self, *args: str, log: Path, **env: str) -> meltano_fork.Process:
        return meltano_fork.spawn(
            self.executable(), args, cwd=self.cwd, env={**self.env, **env}, log=log
        )

    def run(self, *pipeline: str, **env: str) -> subprocess.CompletedProcess[str]:
        meltano: Callable[..., subprocess.CompletedProcess[str]] = self.meltano  # env: settings
        return meltano("run", *(pipeline or PIPELINE), **env)

    def state_get(self, state_id: str) -> Any:
        result = self.meltano("--log-level=warning", "state", "get", state_id)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def mapper_state_running(self) -> bool:
        """Is a mapper of this project running (Meltano passes it a config file in .meltano/run)?"""
        marker = f"{self.root}/.meltano/run/mapper-state/mapper.".encode()
        for pid in os.listdir("/proc"):
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:
                continue
        return False


def make_project(
    root: Path,
    data: Path,
    *,
    state_backend: dict[str, Any] | None = None,
    mappings: list[dict[str, Any]] | None = None,
    loader: str | None = None,
) -> Project:
    """The repository's meltano.yml in ``root``, reading ``data``."""
    doc = yaml.safe_load((REPO / "meltano.yml").read_text())
    for kind in ("extractors", "loaders", "mappers"):
        for plugin in doc["plugins"][kind]:
            plugin["executable"] = _absolute(plugin["executable"])
    doc["plugins"]["extractors"][0]["config"]["data_path"] = str(data)
    if loader:
        doc["plugins"]["loaders"][0]["executable"] = loader
    if state_backend is not None:
        doc["state_backend"] = state_backend
    doc["plugins"]["mappers"][0]["mappings"].extend(mappings or [])
    (root / "elsewhere").mkdir(parents=True)
    (root / "meltano.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    env = tools.tool_env(
        MELTANO_SEND_ANONYMOUS_USAGE_STATS="false",
        MELTANO_CLI_DISABLE_VERSION_CHECK="true",
    )
    return Project(root, env)


def mapper_state(
    *args: str, env: dict[str, str] | None = None, input: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(tools.mapper_state()), *args],
        env=env or clean_env(),
        input=input,
        capture_output=True,
        timeout=120,
        check=False,
    )


def run_sample(
    tmp_path: Path, data: Path, out: Path, env: dict[str, str], **target_config: Any
) -> subprocess.CompletedProcess[bytes]:
    """``mapper-state run`` of STATE_ID from tap-sample reading ``data`` to target-jsonl
    writing under ``out`` (their config files go to ``tmp_path``)."""
    (tmp_path / "tap.json").write_text(json.dumps({"data_path": str(data)}))
    (tmp_path / "target.json").write_text(
        json.dumps({"destination_path": str(out), **target_config})
    )
    return mapper_state(
        "run",
        "--state-id",
        STATE_ID,
        "--tap",
        f"{tools.project_bin('tap-sample')} --config {tmp_path / 'tap.json'}",
        "--target",
        f"{tools.target_jsonl()} --config {tmp_path / 'target.json'}",
        env=env,
    )


def assert_no_fencing_trouble(output: str) -> None:
    for bad in ("lost the lease", "changed by another writer", "mapper-state: error"):
        assert bad not in output, output


# -- the local store ----------------------------------------------------------------------------


def test_meltano_and_mapper_state_keep_one_state_on_the_local_store(tmp_path: Path) -> None:
    data = tmp_path / "events.jsonl"
    add_rows(data, 10)
    project = make_project(tmp_path / "project", data)  # the repository's project, as it is
    store = project.root / ".meltano" / "state"  # file://${MELTANO_PROJECT_ROOT}/.meltano/state
    ours = clean_env(MAPPER_STATE_STATE_BACKEND__URI=f"file://{store}")

    first = project.run()
    assert first.returncode == 0, first.stderr
    assert delivered(project.output) == list(range(1, 11))
    # mapper-state guarded the run and left state.json to Meltano
    assert "leaving state.json to Meltano (lock_only)" in first.stderr
    assert "keeping the lease on dev:tap-sample-to-target-jsonl until Meltano" in first.stderr
    assert_no_fencing_trouble(first.stderr)
    lease.wait_until_free(STATE_ID, ours)
    # state.json is Meltano's own (no writer record of ours); the keeper kept it in the history
    assert "mapper_state" not in json.loads((store / STATE_ID / "state.json").read_bytes())
    kept = mapper_state("state", "history", STATE_ID, "--format", "json", env=ours)
    assert kept.returncode == 0, kept.stderr
    assert [(s["singer_state"], s["current"]) for s in json.loads(kept.stdout)] == [
        (bookmark(data, 10), True)
    ]

    # Meltano's state is what mapper-state reads ...
    assert project.state_get(STATE_ID) == {"singer_state": bookmark(data, 10)}
    got = mapper_state("state", "get", STATE_ID, env=ours)
    assert json.loads(got.stdout) == bookmark(data, 10), got.stderr

    # ... and a state mapper-state writes is what Meltano reads and hands the tap
    result = mapper_state("state", "set", STATE_ID, json.dumps(bookmark(data, 6)), env=ours)
    assert result.returncode == 0, result.stderr
    assert project.state_get(STATE_ID) == {"singer_state": bookmark(data, 6)}
    add_rows(data, 2)
    second = project.run()
    assert second.returncode == 0, second.stderr
    assert delivered(project.output) == [*range(1, 11), *range(7, 13)]
    assert_no_fencing_trouble(second.stderr)
    lease.wait_until_free(STATE_ID, ours)
    assert project.state_get(STATE_ID) == {"singer_state": bookmark(data, 12)}

    # Meltano's state is also what the next `mapper-state run` hands its tap
    add_rows(data, 3)
    out = tmp_path / "run-output"
    run = run_sample(tmp_path, data, out, ours, do_timestamp_file=False)
    assert run.returncode == 0, run.stderr
    assert delivered(out) == [13, 14, 15]
    assert project.state_get(STATE_ID) == {"singer_state": bookmark(data, 15)}


def test_the_history_survives_meltano_state_clear(tmp_path: Path) -> None:
    """`meltano state clear ID` deletes `<store>/<ID>/` whole on the local backend: the
    history lives elsewhere, so `mapper-state state rollback` brings the state back."""
    data = tmp_path / "events.jsonl"
    add_rows(data, 6)
    project = make_project(tmp_path / "project", data)
    store = project.root / ".meltano" / "state"
    ours = clean_env(MAPPER_STATE_STATE_BACKEND__URI=f"file://{store}")
    # a snapshot an earlier mapper-state version kept beside the state, in <ID>/history/
    old = store / STATE_ID / "history" / "20200101T000000.000000Z-earlier.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"run_id": "earlier", "singer_state": bookmark(data, 1)}))
    migrated = mapper_state("state", "migrate", env=ours)  # once, after upgrading
    assert migrated.returncode == 0, migrated.stderr
    assert b"moved 1 snapshot" in migrated.stdout

    first = project.run()
    assert first.returncode == 0, first.stderr
    assert_no_fencing_trouble(first.stderr)
    lease.wait_until_free(STATE_ID, ours)  # the keeper snapshots Meltano's state, then releases
    history = mapper_state("state", "history", STATE_ID, "--format", "json", env=ours)
    snaps = json.loads(history.stdout)
    assert [s["singer_state"] for s in snaps] == [bookmark(data, 6), bookmark(data, 1)]
    assert snaps[0]["written_by"] == "meltano run"
    assert snaps[0]["current"]

    cleared = project.meltano("state", "clear", "--force", STATE_ID)
    assert cleared.returncode == 0, cleared.stderr
    assert not (store / STATE_ID).exists()  # Meltano removed the whole folder
    assert project.state_get(STATE_ID) == {}  # Meltano's view: no state

    history = mapper_state("state", "history", STATE_ID, "--format", "json", env=ours)
    assert history.returncode == 0, history.stderr
    snaps = json.loads(history.stdout)
    assert len(snaps) == 2  # the earlier place's snapshot was moved out of Meltano's reach
    back = mapper_state("state", "rollback", STATE_ID, "--to", snaps[0]["snapshot"], env=ours)
    assert back.returncode == 0, back.stderr
    assert project.state_get(STATE_ID) == {"singer_state": bookmark(data, 6)}

    add_rows(data, 2)
    second = project.run()
    assert second.returncode == 0, second.stderr
    assert delivered(project.output) == [*range(1, 7), 7, 8]  # resumed, not from the start
    lease.wait_until_free(STATE_ID, ours)


def test_a_state_id_of_its_own_and_a_missing_one(tmp_path: Path) -> None:
    data = tmp_path / "events.jsonl"
    add_rows(data, 4)
    project = make_project(
        tmp_path / "project",
        data,
        mappings=[
            {
                "name": "own-state",
                "config": {"state_id": "tap-sample-events", "state_backend.uri": "file://kept"},
            },
            {"name": "no-state-id"},
        ],
    )
    meltano_store = project.root / ".meltano" / "state"

    # a mapping without state_id: the run fails and says which lines to add
    failed = project.run("tap-sample", "no-state-id", "target-jsonl")
    assert failed.returncode != 0
    hint = (
        "mapper-state: error: setting state_id is missing in the Meltano mapping no-state-id; "
        "add it to meltano.yml as below, with your loader's name"
    )
    assert hint in failed.stderr, failed.stderr
    assert delivered(project.output) == []
    assert not (meltano_store / STATE_ID / "state.json").exists()

    # an ID of its own: mapper-state commits it in its store (relative to the project
    # root, not to the cwd), beside the state Meltano keeps under its own ID
    run = project.run("tap-sample", "own-state", "target-jsonl")
    assert run.returncode == 0, run.stderr
    assert_no_fencing_trouble(run.stderr)
    assert "lock_only" not in run.stderr
    assert delivered(project.output) == [1, 2, 3, 4]
    kept = clean_env(MAPPER_STATE_STATE_BACKEND__URI=f"file://{project.root / 'kept'}")
    lease.wait_until_free("tap-sample-events", kept)
    got = mapper_state("state", "get", "tap-sample-events", env=kept)
    assert json.loads(got.stdout) == bookmark(data, 4), got.stderr
    assert project.state_get(STATE_ID) == {"singer_state": bookmark(data, 4)}
    history = mapper_state("state", "history", "tap-sample-events", "--format", "json", env=kept)
    assert len(json.loads(history.stdout)) == 1
    assert not (project.cwd / "kept").exists()

    # Meltano shows the mapping's settings with their descriptions; secrets stay hidden
    listed = project.meltano(
        "--log-level=warning",
        *tools.config_args("list", "own-state"),
        MAPPER_STATE_STATE_BACKEND_S3_AWS_SECRET_ACCESS_KEY="very-secret-value",
    )
    assert listed.returncode == 0, listed.stderr
    assert (
        "state_backend.uri [env: MAPPER_STATE_STATE_BACKEND_URI] current value: 'file://kept'"
        in (listed.stdout)
    )
    assert "Where states live:" in listed.stdout
    assert "state_backend.s3.aws_secret_access_key" in listed.stdout
    assert "(redacted)" in listed.stdout
    assert "very-secret-value" not in listed.stdout


# -- S3 (moto) ----------------------------------------------------------------------------------


def _require_meltano_s3() -> None:
    python = tools.require_tool("meltano", "python")
    check = subprocess.run([str(python), "-c", "import boto3"], capture_output=True, check=False)
    if check.returncode != 0:
        pytest.fail(
            "Meltano's S3 state backend needs boto3 in .tools/meltano: "
            "uv pip install --python .tools/meltano/bin/python 'meltano[s3]==4.4.1'",
            pytrace=False,
        )


def _s3_backend(location) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    o = location.options
    return {
        "uri": location.uri,
        "s3": {
            "aws_access_key_id": o["aws_access_key_id"],
            "aws_secret_access_key": o["aws_secret_access_key"],
            "endpoint_url": o["endpoint_url"],
        },
    }


def _gated_loader(gate: Path) -> str:
    """target-jsonl behind a gate: it reads everything, then waits while ``gate/hold`` exists.

    It plays a target that is still loading after the tap (and the mapper) are done;
    Meltano writes the state only after the target prints it."""
    script = gate / "target-jsonl-slow"
    script.write_text(
        "#!/bin/sh\n"
        f'cat > "{gate}/buffered.jsonl"\n'
        f'touch "{gate}/input-done"\n'
        f'while [ -e "{gate}/hold" ]; do sleep 0.05; done\n'
        f'exec "{tools.target_jsonl()}" "$@" < "{gate}/buffered.jsonl"\n'
    )
    script.chmod(0o755)
    return str(script)


def _wait_for(condition, what: str, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _b_is_refused_naming_the_holder(b: Project, ours: dict[str, str]) -> None:
    """A's mapper is gone but Meltano is not done: the lease is held, and B fails at once,
    naming the holder, without loading a row."""
    status = mapper_state("lock", "status", STATE_ID, "--format", "json", env=ours)
    held = json.loads(status.stdout)
    assert held["status"] == "held", held
    holder = held["holder"]
    started = time.monotonic()
    busy = b.run()
    assert busy.returncode != 0
    assert f"is busy: held by run {holder['run_id']} on host {holder['host']}" in busy.stderr
    assert time.monotonic() - started < 30
    assert delivered(b.output) == list(range(1, 11))


def test_one_run_per_pipeline_across_projects_sharing_a_bucket(tmp_path: Path, s3_location) -> None:  # type: ignore[no-untyped-def]
    """Two copies of the project ("two machines") that share only the S3 bucket."""
    _require_meltano_s3()
    data = tmp_path / "events.jsonl"  # both read the same source
    add_rows(data, 10)
    gate = tmp_path / "gate"
    gate.mkdir()
    backend = _s3_backend(s3_location)
    a = make_project(tmp_path / "a", data, state_backend=backend, loader=_gated_loader(gate))
    b = make_project(tmp_path / "b", data, state_backend=backend)
    ours = clean_env(**s3_location.env)

    first = b.run()
    assert first.returncode == 0, first.stderr
    assert delivered(b.output) == list(range(1, 11))
    lease.wait_until_free(STATE_ID, ours)

    # A runs; its target is still loading when the tap and the mapper are done
    add_rows(data, 5)
    (gate / "hold").touch()
    run_a = a.spawn(*("run", *PIPELINE), log=tmp_path / "a.log")
    try:
        _wait_for(lambda: (gate / "input-done").exists(), "A's target to read its input")
        _wait_for(lambda: not a.mapper_state_running(), "A's mapper to exit")
        _b_is_refused_naming_the_holder(b, ours)

        # B again, willing to wait for the lease: Meltano hands its tap the state it
        # reads now, before A has written the newer one
        b_log = tmp_path / "b-wait.log"
        waiting = b.spawn(
            *("run", *PIPELINE),
            log=b_log,
            MAPPER_STATE_STATE_BACKEND__LOCK_WAIT_SECONDS="120",
        )
        _wait_for(b.mapper_state_running, "B's mapper to start waiting")
    finally:
        (gate / "hold").unlink()
    assert run_a.wait(timeout=120) == 0, (tmp_path / "a.log").read_text()
    a_log = (tmp_path / "a.log").read_text()
    assert_no_fencing_trouble(a_log)
    assert delivered(a.output) == [11, 12, 13, 14, 15]

    # A wrote its state, then released the lease; B's mapper got it, saw that its tap
    # resumes from an older state than the stored one, and refused to load rows twice
    assert waiting.wait(timeout=120) != 0
    b_wait = b_log.read_text()
    assert "another run of this pipeline wrote its state after Meltano read it" in b_wait, b_wait
    assert delivered(b.output) == list(range(1, 11))
    got = mapper_state("state", "get", STATE_ID, env=ours)
    assert json.loads(got.stdout) == bookmark(data, 15), got.stderr

    # the next run of B starts from A's state: every row loaded exactly once
    add_rows(data, 3)
    last = b.run()
    assert last.returncode == 0, last.stderr
    assert delivered(b.output) == [*range(1, 11), 16, 17, 18]


def test_states_cross_between_meltano_and_mapper_state_on_s3(tmp_path: Path, s3_location) -> None:  # type: ignore[no-untyped-def]
    _require_meltano_s3()
    data = tmp_path / "events.jsonl"
    add_rows(data, 6)
    project = make_project(tmp_path / "project", data, state_backend=_s3_backend(s3_location))
    ours = clean_env(**s3_location.env)

    # Meltano writes (`meltano state set`); mapper-state reads it and hands it to a tap
    doc = json.dumps({"singer_state": bookmark(data, 2)})
    result = project.meltano("--log-level=warning", "state", "set", "--force", STATE_ID, doc)
    assert result.returncode == 0, result.stderr
    got = mapper_state("state", "get", STATE_ID, env=ours)
    assert json.loads(got.stdout) == bookmark(data, 2), got.stderr
    out = tmp_path / "out"
    run = run_sample(tmp_path, data, out, ours)
    assert run.returncode == 0, run.stderr
    assert sorted(json.loads(line)["id"] for f in out.glob("*.jsonl") for line in f.open()) == [
        3,
        4,
        5,
        6,
    ]

    # mapper-state writes; Meltano reads it (get, list), and `meltano state get` output
    # goes back into mapper-state with `state import`
    assert project.state_get(STATE_ID) == {"singer_state": bookmark(data, 6)}
    other = {"bookmarks": {"other": {"replication_key_value": 7}}}
    written = mapper_state("state", "set", "dev:tap-x-to-target-y", json.dumps(other), env=ours)
    assert written.returncode == 0, written.stderr
    assert project.state_get("dev:tap-x-to-target-y") == {"singer_state": other}
    printed = project.meltano("--log-level=warning", "state", "get", STATE_ID).stdout
    imported = mapper_state(
        "state", "import", "--state-id", "copy-of-pipeline", env=ours, input=printed.encode()
    )
    assert imported.returncode == 0, imported.stderr
    copied = mapper_state("state", "get", "copy-of-pipeline", env=ours)
    assert json.loads(copied.stdout) == bookmark(data, 6)
    tools.require_meltano("`meltano state list` finding the states under an s3:// URI's prefix")
    listed = project.meltano("--log-level=warning", "state", "list")
    assert sorted(listed.stdout.split()) == sorted(
        ["copy-of-pipeline", "dev:tap-x-to-target-y", STATE_ID]
    )


# -- migrating a whole project ------------------------------------------------------------------


def test_migrating_a_meltano_projects_states_both_ways(tmp_path: Path, s3_location) -> None:  # type: ignore[no-untyped-def]
    """Meltano's system database -> mapper-state's bucket, and back into another project."""
    tools.require_meltano("`meltano state export`")  # and `import`, added with it
    data = tmp_path / "events.jsonl"
    add_rows(data, 1)
    states = {
        STATE_ID: {"bookmarks": {"events": {"replication_key_value": "2024-01-01T00:00:00+00:00"}}},
        "prod:tap-a-to-target-b": {"bookmarks": {"a": {"replication_key_value": 42}}},
    }
    export = {i: {"completed": {"singer_state": v}, "partial": {}} for i, v in states.items()}
    systemdb = {"uri": "systemdb"}
    source = make_project(tmp_path / "source", data, state_backend=systemdb)
    loaded = source.meltano(
        "--log-level=warning", "state", "import", input=json.dumps(export).encode()
    )
    assert loaded.returncode == 0, loaded.stderr
    ours = clean_env(**s3_location.env)

    # meltano state export | mapper-state state import
    exported = source.meltano("--log-level=warning", "state", "export")
    assert exported.returncode == 0, exported.stderr
    imported = mapper_state("state", "import", env=ours, input=exported.stdout.encode())
    assert imported.returncode == 0, imported.stderr
    listed = mapper_state("state", "list", env=ours)
    assert listed.stdout.decode().split() == sorted(states)
    for state_id, value in states.items():
        assert json.loads(mapper_state("state", "get", state_id, env=ours).stdout) == value

    # mapper-state state export --meltano | meltano state import
    back = mapper_state("state", "export", "--meltano", env=ours)
    assert back.returncode == 0, back.stderr
    target = make_project(tmp_path / "target", data, state_backend=systemdb)
    loaded = target.meltano("--log-level=warning", "state", "import", input=back.stdout)
    assert loaded.returncode == 0, loaded.stderr
    again = target.meltano("--log-level=warning", "state", "export")
    assert json.loads(again.stdout) == export


def test_a_busy_refusal_reaches_meltanos_log_as_an_error(tmp_path: Path) -> None:
    """With the plugin's ``structured-logging`` capability (its definition declares it), the
    busy line is an error in Meltano's log, beside "Intermediate block failed", not info."""
    from mapper_state.core.lease import Lease
    from mapper_state.stores.file import FileStore

    data = tmp_path / "events.jsonl"
    add_rows(data, 5)
    project = make_project(tmp_path / "p", data)
    doc = yaml.safe_load((project.root / "meltano.yml").read_text())
    doc["plugins"]["mappers"][0]["capabilities"] = ["about", "structured-logging"]
    (project.root / "meltano.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    holder = Lease(FileStore(project.root / ".meltano" / "state"), STATE_ID, ttl=120)
    holder.acquire()
    try:
        busy = project.meltano("--log-format=json", "run", *PIPELINE)
    finally:
        holder.release()
    assert busy.returncode != 0
    assert "is busy: held by run" in busy.stderr, busy.stderr[-3000:]
    tools.require_meltano("`structured-logging` for a mapper")
    records = [json.loads(line) for line in busy.stderr.splitlines() if line.startswith("{")]
    refused = [r for r in records if "is busy: held by run" in str(r.get("event"))]
    assert refused, busy.stderr[-3000:]
    assert {r["level"] for r in refused} == {"error"}, refused
    assert all(r["event"].startswith("mapper-state: error: ") for r in refused)
