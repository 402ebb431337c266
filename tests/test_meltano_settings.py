"""mapper-state as Meltano runs it, without a Meltano process.

The repository's meltano.yml must declare exactly the settings `--about` exposes.
The other tests run the real `mapper-state` the way Meltano 4.4.1 does (observed and
written down in docs/real-tools.md): `mapper-state --config <file>` with only the
mapping's config in the file, Meltano's variables in the environment, started from
whatever directory `meltano` was started in. A shell stands in for Meltano as the
mapper's parent process: mapper-state keeps its lease until that parent exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import MAPPER, clean_env, state_line, stored_state, wait_until
from tests.support.cli import invoke, invoke_filter
from tests.support.lease import wait_until_free
from tests.support.meltano import mapping_env

REPO = Path(__file__).resolve().parent.parent
MELTANO_ID = "dev:tap-sample-to-target-jsonl"
LEASE = "mapper-state.lease.json"
BOOKMARK = {"bookmarks": {"events": {"replication_key_value": "2024-01-01T00:00:05+00:00"}}}

# -- the repository's meltano.yml ------------------------------------------------------

#: A number is a ``string`` (Meltano 3.7 knows no ``decimal``; mapper-state reads it).
MELTANO_KIND = {"string": "string", "number": "string", "integer": "integer", "boolean": "boolean"}


def _meltano_yml() -> dict[str, Any]:
    project: dict[str, Any] = yaml.safe_load((REPO / "meltano.yml").read_text())
    return project


def _mapper_plugin() -> dict[str, Any]:
    mappers = _meltano_yml()["plugins"]["mappers"]
    return next(m for m in mappers if m["name"] == "mapper-state")


def _about_settings() -> dict[str, dict[str, Any]]:
    """`mapper-state --about --format json`'s settings schema, by dotted name."""
    result = invoke("--about", "--format", "json")
    assert result.returncode == 0, result.stderr
    found: dict[str, dict[str, Any]] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, prop in node["properties"].items():
            if "properties" in prop:
                walk(prop, f"{prefix}{key}.")
            else:
                found[f"{prefix}{key}"] = prop

    walk(json.loads(result.stdout)["settings"], "")
    return found


def test_meltano_yml_declares_the_settings_about_exposes() -> None:
    about = _about_settings()
    declared = {s["name"]: s for s in _mapper_plugin()["settings"]}
    assert list(declared) == list(about), "meltano.yml and --about list different settings"
    for name, prop in about.items():
        setting = declared[name]
        kind = next(t for t in prop["type"] if t != "null")
        assert setting["kind"] == MELTANO_KIND[kind], name
        assert setting["description"] == prop["description"], name
        assert bool(setting.get("sensitive")) == bool(prop.get("secret")), name
        # A declared value would be written into every mapping's config, where it outranks
        # Meltano's own state backend and the lock_only default.
        assert "value" not in setting, name


def test_meltano_yml_mapping_names_its_pipelines_state_id() -> None:
    project = _meltano_yml()
    extractor = project["plugins"]["extractors"][0]["name"]
    loader = project["plugins"]["loaders"][0]["name"]
    mapping = _mapper_plugin()["mappings"][0]
    assert mapping["config"]["state_id"] == f"${{MELTANO_ENVIRONMENT}}:{extractor}-to-{loader}"
    # mapper-state's store is Meltano's: the mapping does not name another one
    assert "state_backend" not in mapping["config"]
    assert "state_backend.uri" not in mapping["config"]
    assert project["state_backend"]["uri"].startswith("file://${MELTANO_PROJECT_ROOT}/")


# -- running as Meltano does -----------------------------------------------------------

#: What else Meltano 4.4.1 exports to a mapping, beside what mapper-state reads.
MELTANO_ALSO_EXPORTS = {
    "MELTANO_DEFAULT_ENVIRONMENT": "dev",
    "MELTANO_EXTRACTOR_NAMESPACE": "tap_sample",
    "MELTANO_MAPPER_NAMESPACE": "mapper_state",
    "MELTANO_MAP__MAPPING": "true",
    "MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS": "10",
    "MELTANO_STATE_BACKEND_LOCK_RETRY_SECONDS": "1",
    "MELTANO_JOB_TRIGGER": "cli",
}


def meltano_env(project: Path, backend: str = "systemdb", **extra: str) -> dict[str, str]:
    """The variables Meltano 4.4.1 exported to a mapping in `meltano run tap-sample remote-state
    target-jsonl` (docs/real-tools.md), without the extractor's own settings."""
    return mapping_env(project, backend, **MELTANO_ALSO_EXPORTS, **extra)


def config_file(project: Path, config: dict[str, Any]) -> Path:
    """Where and how Meltano writes the mapping's config for one run."""
    run_dir = project / ".meltano" / "run" / "mapper-state"
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"mapper.{uuid.uuid4()}.config.json"
    path.write_text(json.dumps(config))
    return path


# The stand-in for Meltano: runs the mapper, records its exit code, and lives on until
# the file named by $HOLD (if any) is gone, as Meltano lives on to write the state.
PARENT = '"$0" --config "$1" <"$2" >"$3"; echo $? >"$4"; while [ -e "$HOLD" ]; do sleep 0.05; done'


class MappingRun:
    """One mapper process started the way Meltano starts it, under a stand-in parent."""

    def __init__(
        self,
        project: Path,
        config: dict[str, Any],
        env: dict[str, str],
        *,
        cwd: Path | None = None,
        stream: bytes = b"",
        hold: Path | None = None,
    ) -> None:
        tag = uuid.uuid4().hex[:8]
        self.dir = project / ".test-runs" / tag
        self.dir.mkdir(parents=True)
        (self.dir / "in").write_bytes(stream)
        self.rc_file = self.dir / "rc"
        cfg = config_file(project, config)
        self.parent = subprocess.Popen(
            [
                "sh",
                "-c",
                PARENT,
                MAPPER,
                str(cfg),
                *(str(self.dir / n) for n in ("in", "out", "rc")),
            ],
            cwd=cwd or project,
            env={**env, "HOLD": str(hold or self.dir / "no-hold")},
            stderr=subprocess.PIPE,
        )

    def mapper_exit_code(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.rc_file.exists() and self.rc_file.read_text().strip():
                return int(self.rc_file.read_text())
            time.sleep(0.02)
        raise AssertionError("the mapper did not exit")

    def wait(self, timeout: float = 30) -> tuple[int, str]:
        _, err = self.parent.communicate(timeout=timeout)
        return self.mapper_exit_code(), err.decode()

    @property
    def stdout(self) -> bytes:
        return (self.dir / "out").read_bytes()


def run_mapping(
    project: Path,
    config: dict[str, Any],
    env: dict[str, str],
    *,
    cwd: Path | None = None,
    stream: bytes = b"",
) -> tuple[int, str]:
    """Run to the end, as `meltano run` would; returns the mapper's exit code and stderr."""
    return MappingRun(project, config, env, cwd=cwd, stream=stream).wait()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "transform" / "deep").mkdir(parents=True)  # somewhere to start `meltano` from
    return root


STREAM = (
    b'{"type":"SCHEMA","stream":"events","schema":{},"key_properties":["id"]}\n'
    b'{"type":"RECORD","stream":"events","record":{"id":5}}\n' + state_line(BOOKMARK)
)


# -- state_id ------------------------------------------------------------------------------


def test_a_mapping_without_state_id_says_what_to_add_to_meltano_yml(project: Path) -> None:
    env = meltano_env(project, f"file://{project}/.meltano/state")
    code, err = run_mapping(project, {}, env, stream=STREAM)
    assert code == 2, err
    assert "add it to meltano.yml as below, with your loader's name" in err
    assert "\n        - name: remote-state\n" in err  # the YAML, line by line
    assert "\n            state_id: dev:tap-sample-to-<loader>\n" in err
    assert not (project / ".meltano" / "state").exists()
    # outside Meltano the error does not talk about meltano.yml
    result = invoke_filter(cwd=project, input=STREAM)
    assert result.returncode == 2
    assert b"meltano.yml" not in result.stderr
    assert b"state_id is required" in result.stderr


# -- where the store is -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "where"),
    [
        ("file://{project}/.meltano/state", "{project}/.meltano/state"),
        # Meltano uses only the URI's path: `localhost` names this machine
        ("file://localhost{project}/.meltano/state", "{project}/.meltano/state"),
    ],
)
def test_meltanos_backend_is_read_where_meltano_reads_it(
    project: Path, uri: str, where: str
) -> None:
    env = meltano_env(project, uri.format(project=project))
    store = Path(where.format(project=project))
    config = {"state_id": "events-copy"}  # an ID of its own: mapper-state writes it
    code, err = run_mapping(project, config, env, cwd=project / "transform" / "deep", stream=STREAM)
    assert code == 0, err
    assert stored_state(store, "events-copy") == BOOKMARK
    wait_until_free("events-copy", clean_env(MAPPER_STATE_STATE_BACKEND__URI=f"file://{store}"))
    # and `state get` in the same environment and directory reads the same place
    got = invoke("state", "get", "events-copy", cwd=project / "transform" / "deep", env=env)
    assert json.loads(got.stdout) == BOOKMARK, got.stderr


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("file:meltano-state", "has no absolute path"),
        ("file:", "has no absolute path"),
        ("file://meltano-state", ": Meltano reads 'meltano-state' as a host name and keeps no"),
        ("file://anyhost/abs", ": Meltano reads 'anyhost' as a host name and keeps the state in"),
    ],
)
def test_a_relative_meltano_file_uri_is_refused(project: Path, uri: str, why: str) -> None:
    # Meltano 4.4.1 keeps no state with the relative ones, and drops a host: say so
    # rather than guess
    env = meltano_env(project, uri)
    code, err = run_mapping(project, {"state_id": "events-copy"}, env, stream=STREAM)
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert f"MELTANO_STATE_BACKEND_URI {uri}{' ' if why[0] != ':' else ''}{why}" in err
    # a store named in the mapping's config wins over Meltano's: no error then
    config = {"state_id": "events-copy", "state_backend.uri": "file://mine"}
    code, err = run_mapping(project, config, env, stream=STREAM)
    assert code == 0, err
    assert stored_state(project / "mine", "events-copy") == BOOKMARK


def test_a_file_uri_with_a_relative_host_is_refused_not_followed_to_the_root(
    project: Path,
) -> None:
    # `file://.meltano/state` is `/state` to Meltano (".meltano" parses as a host name)
    env = meltano_env(project, "file://.meltano/state")
    result = invoke("state", "list", cwd=project, env=env)
    assert result.returncode == 2, result.stderr
    assert b"keeps the state in /state; write file:///absolute/path" in result.stderr


@pytest.mark.parametrize(
    ("config", "where"),
    [
        ({"state_backend.uri": "file://mapper-store"}, "mapper-store"),
        ({"state_backend": {"uri": "file:mapper-store"}}, "mapper-store"),
        ({"state_backend.uri": "mapper-store"}, "mapper-store"),
        ({}, ".mapper-state"),  # Meltano's systemdb is not a store: the default one
    ],
)
def test_a_relative_store_is_the_projects_whatever_the_cwd(
    project: Path, config: dict[str, Any], where: str
) -> None:
    env = meltano_env(project)  # systemdb
    config = {**config, "state_id": MELTANO_ID}
    code, err = run_mapping(project, config, env, cwd=project / "transform" / "deep", stream=STREAM)
    assert code == 0, err
    # not Meltano's store, so mapper-state keeps the state itself
    assert stored_state(project / where, MELTANO_ID) == BOOKMARK
    assert not list((project / "transform").rglob("state.json"))


# -- lock_only -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state_id", "lock_only", "writes", "says"),
    [
        (MELTANO_ID, None, False, "leaving state.json to Meltano (lock_only)"),
        ("dev:tap-sample-to-target-csv", None, False, "leaving state.json to Meltano"),
        ("tap-sample-events", None, True, ""),
        (MELTANO_ID, True, False, ""),
        ("tap-sample-events", True, False, ""),
        (MELTANO_ID, False, True, "both will write it"),
    ],
)
def test_lock_only_by_default_on_the_state_meltano_writes(
    project: Path, state_id: str, lock_only: bool | None, writes: bool, says: str
) -> None:
    store = project / ".meltano" / "state"
    env = meltano_env(project, f"file://{store}")
    config: dict[str, Any] = {"state_id": state_id}
    if lock_only is not None:
        config["lock_only"] = lock_only
    run = MappingRun(project, config, env, stream=STREAM)
    code, err = run.wait()
    assert code == 0, err
    assert run.stdout == STREAM
    assert (stored_state(store, state_id) == BOOKMARK) is writes
    assert says in err


def test_lock_only_by_default_only_when_the_store_is_meltanos(project: Path) -> None:
    # Meltano's ID, but another store than Meltano's: mapper-state writes it there
    env = meltano_env(project, f"file://{project}/.meltano/state")
    config = {"state_id": MELTANO_ID, "state_backend": {"uri": f"file://{project}/elsewhere"}}
    code, err = run_mapping(project, config, env, stream=STREAM)
    assert code == 0, err
    assert stored_state(project / "elsewhere", MELTANO_ID) == BOOKMARK
    # the same store spelled differently is still Meltano's
    config = {"state_id": MELTANO_ID, "state_backend.uri": "file://.meltano/state/"}
    code, err = run_mapping(project, config, env, stream=STREAM)
    assert code == 0, err
    assert "lock_only" in err
    assert stored_state(project / ".meltano" / "state", MELTANO_ID) is None


# -- the config file's shapes ------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [
        # nested, as written in meltano.yml
        {"state_id": "s", "state_backend": {"uri": "file://st", "lock_timeout_seconds": 46}},
        # all dotted in meltano.yml: Meltano writes both forms
        {
            "state_id": "s",
            "state_backend": {"uri": "file://st", "lock_timeout_seconds": 46},
            "state_backend.uri": "file://st",
            "state_backend.lock_timeout_seconds": 46,
        },
        # mixed: the nested object as written plus the dotted key beside it
        {
            "state_id": "s",
            "state_backend": {"lock_timeout_seconds": 46},
            "state_backend.uri": "file://st",
        },
    ],
    ids=["nested", "dotted", "mixed"],
)
def test_every_config_shape_meltano_writes_is_read(project: Path, shape: dict[str, Any]) -> None:
    env = meltano_env(project)
    run = MappingRun(project, shape, env, stream=STREAM, hold=project / "hold")
    (project / "hold").touch()
    try:
        assert run.mapper_exit_code() == 0
        lease = json.loads((project / "st" / "s" / LEASE).read_bytes())
        assert lease["ttl_seconds"] == 46
        assert stored_state(project / "st", "s") == BOOKMARK
    finally:
        (project / "hold").unlink()
        run.wait()
    bad = json.loads(json.dumps(shape).replace("46", "0.1"))
    code, err = run_mapping(project, bad, env, stream=STREAM)
    assert code == 2
    assert "setting state_backend.lock_timeout_seconds" in err
    assert "at least 0.5" in err


# -- the lease outlives the mapper until Meltano exits -----------------------------------


def test_meltanos_default_lock_timeout_is_raised_to_the_floor(project: Path) -> None:
    """Meltano exports its ``lock_timeout_seconds`` (10 s by default) to the mapper: the
    mapper's lease gets the same 30 s floor as the add-on's; a longer one is kept."""
    from mapper_state.meltano.backend_schemes import MINIMUM_TTL_SECONDS

    store = project / ".meltano" / "state"
    for exported, expected in (("10", MINIMUM_TTL_SECONDS), ("46", 46)):
        exports = {**MELTANO_ALSO_EXPORTS, "MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS": exported}
        env = mapping_env(project, f"file://{store}", **exports)
        hold = project / "hold"
        hold.touch()
        run = MappingRun(project, {"state_id": "ttl"}, env, stream=STREAM, hold=hold)
        try:
            assert run.mapper_exit_code() == 0
            lease = json.loads((store / "ttl" / LEASE).read_bytes())
            assert lease["ttl_seconds"] == expected
        finally:
            hold.unlink()
            run.wait()
        wait_until(lambda: not (store / "ttl" / LEASE).exists(), "the lease released")


def test_the_lease_is_kept_until_meltano_has_exited(project: Path) -> None:
    store = project / ".meltano" / "state"
    env = meltano_env(project, f"file://{store}")
    hold = project / "meltano-still-writing"
    hold.touch()
    first = MappingRun(project, {"state_id": MELTANO_ID}, env, stream=STREAM, hold=hold)
    assert first.mapper_exit_code() == 0
    assert first.stdout == STREAM

    # the mapper has exited; its parent (Meltano) has not, so the lease is still held
    def status() -> dict[str, Any]:
        shown = invoke("lock", "status", MELTANO_ID, "--format", "json", env=env, cwd=project)
        return dict(json.loads(shown.stdout))

    held = status()
    assert held["status"] == "held", held
    # the keeper records itself as the holder with its first renewal, moments after the
    # mapper has handed the lease over and exited
    keeper_says = f"until Meltano pid {first.parent.pid} exits"
    wait_until(lambda: keeper_says in status()["holder"]["command"], "the keeper's record")
    held = status()
    assert held["status"] == "held", held
    keeper = held["holder"]["pid"]
    os.kill(keeper, 0)  # the holder recorded is a live process
    # another run of the same pipeline fails at once and says who holds it
    started = time.monotonic()
    code, err = run_mapping(project, {"state_id": MELTANO_ID}, env, stream=STREAM)
    assert code == 3, err
    assert time.monotonic() - started < 5
    assert f"is busy: held by run {held['holder']['run_id']} on host" in err
    assert f"(pid {keeper})" in err
    # meanwhile "Meltano" writes the state the target confirmed: nothing of ours minds
    (store / MELTANO_ID).mkdir(parents=True, exist_ok=True)
    (store / MELTANO_ID / "state.json").write_text(
        json.dumps({"completed": {"singer_state": BOOKMARK}, "partial": {}})
    )
    hold.unlink()
    _, err = first.wait()
    assert "keeping the lease" in err
    wait_until_free(MELTANO_ID, clean_env(MAPPER_STATE_STATE_BACKEND__URI=f"file://{store}"))
    code, err = run_mapping(project, {"state_id": MELTANO_ID}, env, stream=STREAM)
    assert code == 0, err


def test_a_failed_run_releases_the_lease_at_once(project: Path) -> None:
    store = project / ".meltano" / "state"
    env = meltano_env(project, f"file://{store}")
    hold = project / "meltano-still-running"
    hold.touch()
    bad = b'{"type":"STATE"}\n'  # no value: fatal with strict
    run = MappingRun(project, {"state_id": MELTANO_ID, "strict": True}, env, stream=bad, hold=hold)
    try:
        assert run.mapper_exit_code() == 6
        assert not (store / MELTANO_ID / LEASE).exists()
    finally:
        hold.unlink()
        run.wait()


# -- the state Meltano handed the tap ------------------------------------------------------


def _handed(project: Path, value: Any) -> None:
    run_dir = project / ".meltano" / "run" / "tap-sample"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "state.json").write_text(json.dumps(value, indent=2))


def _meltano_wrote(store: Path, state_id: str, value: Any) -> None:
    (store / state_id).mkdir(parents=True, exist_ok=True)
    doc = {"completed": {"singer_state": value}, "partial": {}}
    (store / state_id / "state.json").write_text(json.dumps(doc))


def _run_after_meltano_read(
    project: Path, handed: Any, state_id: str = MELTANO_ID
) -> tuple[int, str]:
    """A mapping run for ``state_id`` on the project's file store, in a run where Meltano
    handed the tap ``handed``: the mapper's exit code and stderr."""
    _handed(project, handed)
    env = meltano_env(project, f"file://{project / '.meltano' / 'state'}")
    return run_mapping(project, {"state_id": state_id}, env, stream=STREAM)


def test_a_run_whose_tap_got_a_stale_state_is_refused(project: Path) -> None:
    store = project / ".meltano" / "state"
    older = {"bookmarks": {"events": {"replication_key_value": "2024-01-01T00:00:01+00:00"}}}
    # Meltano handed the tap the state it read; another run wrote a newer one since
    _meltano_wrote(store, MELTANO_ID, BOOKMARK)
    code, err = _run_after_meltano_read(project, older)
    assert code == 4, err
    errors = [line for line in err.splitlines() if line.startswith("mapper-state: error:")]
    assert len(errors) == 1, err
    assert "another run of this pipeline wrote its state after Meltano read it" in err
    assert stored_state(store, MELTANO_ID) == BOOKMARK
    # the tap got the stored state: all is well
    code, err = _run_after_meltano_read(project, BOOKMARK)
    assert code == 0, err


def test_a_state_id_that_is_not_the_pipelines_is_caught(project: Path) -> None:
    _meltano_wrote(project / ".meltano" / "state", MELTANO_ID, BOOKMARK)
    # Meltano's state for ...-to-target-jsonl, and a typo'd loader
    code, err = _run_after_meltano_read(project, BOOKMARK, "dev:tap-sample-to-target-csv")
    assert code == 4, err
    assert "state_id is not this pipeline's Meltano state ID (dev:tap-sample-to-<loader>)" in err


# -- S3, configured the way Meltano configures its own backend --------------------------------


@pytest.mark.cloud
def test_meltanos_s3_backend_with_credentials_in_the_uri(project: Path, s3_location) -> None:  # type: ignore[no-untyped-def]
    o = s3_location.options
    uri = f"s3://{o['aws_access_key_id']}:{o['aws_secret_access_key']}@{s3_location.bucket}/{s3_location.prefix}"
    env = meltano_env(
        project,
        uri,
        MELTANO_STATE_BACKEND_S3_ENDPOINT_URL=o["endpoint_url"],
        AWS_DEFAULT_REGION=o["region"],
    )
    code, err = run_mapping(project, {"state_id": "events-copy"}, env, stream=STREAM)
    assert code == 0, err
    assert o["aws_secret_access_key"] not in err
    store = s3_location.open()
    blob = store.read("events-copy/state.json")
    assert blob is not None
    assert json.loads(blob.data)["completed"]["singer_state"] == BOOKMARK
