"""Meltano's state backend add-on, with the real Meltano 4.4.1 and the project's wheel in its venv.

One session fixture builds a virtualenv that sees Meltano's own packages (a ``.pth`` to its
site-packages: what ``pip install`` into Meltano's venv gives) and installs the wheel into
it with Meltano's pins as constraints, once. Each test then points ``state_backend.uri`` at
``mapper-state+<store>://...`` and runs ``meltano`` commands against a real server.

Meltano takes seconds to start on a busy machine, so the default suite runs the whole
matrix on the local store and on S3 (moto), and a short round on each other store;
``MAPPER_STATE_MELTANO_BACKEND=full`` runs everything everywhere (and races Meltano's own
file backend beside the add-on, for comparison), and
``MAPPER_STATE_MELTANO_BACKEND_ROUNDS`` sets the rounds of the concurrent-merge race
(the race's figures, lost streams per round, go to the test's output with ``-s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mapper_state.core import history, state
from mapper_state.stores import open_store
from mapper_state.stores.base import BlobStore
from tests.dist import Dist, built_once
from tests.e2e import tools
from tests.e2e.test_meltano import (
    PIPELINE,
    STATE_ID,
    Project,
    add_rows,
    bookmark,
    delivered,
    make_project,
)
from tests.helpers import clean_env

pytestmark = pytest.mark.e2e

FULL = os.environ.get("MAPPER_STATE_MELTANO_BACKEND") == "full"
ROUNDS = int(os.environ.get("MAPPER_STATE_MELTANO_BACKEND_ROUNDS", "1"))
MELTANO_SITE = tools.MELTANO_SITE
WRITERS = 8


# -- Meltano with the add-on ------------------------------------------------------------


def addon_launcher(
    tmp_path_factory: pytest.TempPathFactory, built_dist: Dist, minor: str | None = None
) -> Path:
    """``meltano`` of a venv holding Meltano ``minor`` (default the one the run tests,
    :data:`tools.MELTANO_MINOR`) and the project's wheel (made once for the run, whichever
    worker asks first)."""
    minor = minor or tools.MELTANO_MINOR

    def make(root: Path) -> None:
        venv = root / "venv"
        tools.venv_seeing_meltano(venv, f"{built_dist.wheel}[all]", minor=minor)
        launcher = venv / "bin" / "meltano"
        launcher.write_text(
            f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom meltano.cli import main\n"
            "sys.exit(main())\n"
        )
        launcher.chmod(0o755)

    name = "meltano-addon-venv" + ("" if minor == tools.NEWEST_MELTANO else f"-{minor}")
    return built_once(tmp_path_factory, name, make) / "venv" / "bin" / "meltano"


@pytest.fixture(scope="session")
def meltano_addon(tmp_path_factory: pytest.TempPathFactory, built_dist: Dist) -> Path:
    """``meltano`` with the add-on, of the Meltano minor the run tests."""
    return addon_launcher(tmp_path_factory, built_dist)


@dataclass
class Backend:
    """A store for the add-on: its URI for Meltano, the environment, and a client of ours."""

    name: str
    uri: str  # the store's own URI
    env: dict[str, str]
    open: Callable[[], BlobStore]

    @property
    def addon_uri(self) -> str:
        return "mapper-state+" + self.uri


@dataclass
class AddonProject(Project):
    """A Meltano project whose ``meltano`` is the one with the add-on."""

    launcher: Path = Path()

    def executable(self) -> Path:
        return self.launcher

    def meltano(
        self, *args: str, input: bytes | None = None, timeout: float = 180, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return super().meltano(*args, input=input, timeout=timeout, **env)

    def state(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.meltano("--log-level=warning", "state", *args, **env)  # type: ignore[arg-type]

    def ok(self, *args: str, **env: str) -> str:
        result = self.state(*args, **env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        return result.stdout


def _store_env(location: Any) -> dict[str, str]:
    env = {k: v for k, v in location.env.items() if k != "MAPPER_STATE_STATE_BACKEND__URI"}
    return env


@pytest.fixture
def file_backend(tmp_path: Path) -> Backend:
    root = tmp_path / "store"
    return Backend("file", f"file://{root}", {}, lambda: open_store(f"file://{root}"))


def _location_backend(name: str, location: Any) -> Backend:
    return Backend(name, location.uri, _store_env(location), location.open)


@pytest.fixture
def pg_backend(pg_location: Any) -> Backend:
    return Backend(
        "postgres",
        pg_location.uri,
        _store_env(pg_location),
        lambda: open_store(pg_location.uri, {"postgres": pg_location.options}),
    )


HEAVY = ["file_backend", pytest.param("s3_backend", marks=pytest.mark.cloud)]
OTHERS = [
    pytest.param(name, marks=pytest.mark.cloud)
    for name in ("rgw_backend", "azure_backend", "gcs_backend", "pg_backend")
]


#: The backends that are a location fixture of tests/conftest.py (``s3_location``...) as is.
ON_A_LOCATION = ("s3", "rgw", "azure", "gcs")


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Backend:
    """The backend named by the parameter: ``<name>_backend``."""
    name = request.param.removesuffix("_backend")
    if name in ON_A_LOCATION:
        return _location_backend(name, request.getfixturevalue(f"{name}_location"))
    found: Backend = request.getfixturevalue(request.param)
    return found


def project_for(
    root: Path, launcher: Path, backend: Backend, uri: str | None = None
) -> AddonProject:
    (root / "elsewhere").mkdir(parents=True)
    doc = tools.meltano_project(root, {})
    doc["state_backend"] = {"uri": uri or backend.addon_uri, "lock_timeout_seconds": 10}
    (root / "meltano.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    env = tools.tool_env(
        MELTANO_SEND_ANONYMOUS_USAGE_STATS="false",
        MELTANO_CLI_DISABLE_VERSION_CHECK="true",
        **backend.env,
    )
    return AddonProject(root, env, launcher=launcher)


def singer(value: Any) -> str:
    return json.dumps({"singer_state": value})


def stored(backend: Backend, state_id: str) -> Any:
    store = backend.open()
    try:
        return state.load(store, state_id).value
    finally:
        store.close()


# -- every `meltano state` subcommand -------------------------------------------------------


def _subcommands(project: AddonProject, backend: Backend) -> None:
    a = {"bookmarks": {"s1": {"id": 1}}}
    project.ok("set", "--force", "dev:a", singer(a))
    project.ok("merge", "dev:a", singer({"bookmarks": {"s2": {"id": 2}}}))
    both = {"bookmarks": {"s1": {"id": 1}, "s2": {"id": 2}}}
    assert json.loads(project.ok("get", "dev:a")) == {"singer_state": both}
    # plain mapper-state reads what the add-on wrote (the store's own URI), with its history
    assert stored(backend, "dev:a") == both
    store = backend.open()
    try:
        assert [s.value for s in history.list_snapshots(store, "dev:a")] == [a, both]
    finally:
        store.close()
    project.ok("copy", "--force", "dev:a", "dev:b")
    project.ok("move", "--force", "dev:b", "dev:c")
    assert project.ok("list").split() == ["dev:a", "dev:c"]
    assert project.ok("list", "--pattern", "*:c").split() == ["dev:c"]
    assert stored(backend, "dev:c") == both
    project.ok("clear", "--force", "dev:a")
    assert stored(backend, "dev:a") is None
    project.ok("clear", "--force", "--all")
    assert project.ok("list").split() == []
    # the subcommands an older Meltano lacks, last: the test ends there on that minor
    project.ok("set", "--force", "dev:a", singer(both))
    tools.require_meltano("`meltano state edit`")
    editor = project.root / "editor"
    editor.write_text('#!/bin/sh\nsed -i \'s/"id": 2$/"id": 7/\' "$1"\n')
    editor.chmod(0o755)
    project.ok("edit", "--force", "dev:a", EDITOR=str(editor))
    edited = {"bookmarks": {"s1": {"id": 1}, "s2": {"id": 7}}}
    assert stored(backend, "dev:a") == edited
    tools.require_meltano("`meltano state export`")
    project.ok("copy", "--force", "dev:a", "dev:c")
    exported = project.ok("export")
    project.ok("clear", "--force", "--all")
    assert project.ok("list").split() == []
    dump = Path(project.root / "export.json")
    dump.write_text(exported)
    project.ok("import", str(dump))
    assert project.ok("list").split() == ["dev:a", "dev:c"]
    assert stored(backend, "dev:c") == edited


def _short_round(project: AddonProject, backend: Backend) -> None:
    project.ok("set", "--force", "dev:a", singer({"bookmarks": {"s1": {"id": 1}}}))
    project.ok("merge", "dev:a", singer({"bookmarks": {"s2": {"id": 2}}}))
    assert stored(backend, "dev:a") == {"bookmarks": {"s1": {"id": 1}, "s2": {"id": 2}}}
    assert project.ok("list").split() == ["dev:a"]
    project.ok("clear", "--force", "dev:a")
    assert stored(backend, "dev:a") is None


@pytest.mark.parametrize("backend", HEAVY, indirect=True)
def test_every_state_subcommand(tmp_path: Path, meltano_addon: Path, backend: Backend) -> None:
    _subcommands(project_for(tmp_path / "p", meltano_addon, backend), backend)


def test_a_state_written_but_not_its_snapshot_is_a_warning(
    tmp_path: Path, meltano_addon: Path, file_backend: Backend
) -> None:
    """The commit path's rule: the state is written, so a failed snapshot of it does not
    fail the Meltano command (it did: Meltano then reported a write that had landed)."""
    project = project_for(tmp_path / "p", meltano_addon, file_backend)
    history_root = tmp_path / "store" / history.HISTORY_ROOT
    history_root.parent.mkdir(parents=True)
    history_root.write_text("")  # a file where the folder of snapshots would be
    value = {"bookmarks": {"s1": {"id": 1}}}
    result = project.state("set", "--force", "dev:a", singer(value))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the state of dev:a was written, but not its history snapshot" in result.stderr
    assert stored(file_backend, "dev:a") == value


@pytest.mark.parametrize("backend", OTHERS, indirect=True)
def test_state_subcommands_on_the_other_stores(
    tmp_path: Path, meltano_addon: Path, backend: Backend
) -> None:
    project = project_for(tmp_path / "p", meltano_addon, backend)
    (_subcommands if FULL else _short_round)(project, backend)


# -- concurrent writers ---------------------------------------------------------------------


def merge_race(project: AddonProject, state_id: str) -> list[int]:
    """8 concurrent ``meltano state merge``, each adding its own stream: the exit codes."""
    procs = [
        project.spawn(
            "--log-level=warning",
            "state",
            "merge",
            state_id,
            singer({"bookmarks": {f"s{n}": {"id": n}}}),
            log=project.root / f"merge-{n}.log",
        )
        for n in range(WRITERS)
    ]
    return [p.wait(timeout=600) for p in procs]


def streams_of(value: Any) -> set[str]:
    return set((value or {}).get("bookmarks", {}))


@pytest.mark.parametrize("backend", HEAVY, indirect=True)
def test_concurrent_merges_lose_nothing(
    tmp_path: Path, meltano_addon: Path, backend: Backend
) -> None:
    project = project_for(tmp_path / "p", meltano_addon, backend)
    # Meltano's own file backend, measured beside the add-on when the whole matrix runs (not
    # asserted: its window is narrow; the figure goes to the output with -s)
    compared = FULL and backend.name == "file"
    theirs = project_for(
        tmp_path / "builtin", meltano_addon, backend, uri=f"file://{tmp_path}/builtin-state"
    )
    lost_by_meltano = 0
    for each in (project, theirs) if compared else (project,):
        each.ok("list")  # a fresh project's first commands race to create its database
    for round_no in range(ROUNDS):
        state_id = f"dev:race-{round_no}"
        codes = merge_race(project, state_id)
        logs = "".join(p.read_text() for p in project.root.glob("merge-*.log"))
        assert codes == [0] * WRITERS, logs
        assert streams_of(stored(backend, state_id)) == {f"s{n}" for n in range(WRITERS)}
        if compared:
            merge_race(theirs, state_id)
            got = json.loads(theirs.ok("get", state_id))["singer_state"]
            lost_by_meltano += WRITERS - len(streams_of(got))
    print(
        f"merge race, {ROUNDS} round(s) of {WRITERS}: mapper-state+{backend.name} lost 0 streams"
        + (f"; Meltano's file backend lost {lost_by_meltano}" if compared else "")
    )


@contextlib.contextmanager
def filter_holding(backend: Backend, state_id: str) -> Iterator[subprocess.Popen[bytes]]:
    """The filter on ``state_id`` once it holds the lease in ``backend`` (a file store);
    its input closed, and it waited for, on the way out."""
    holder = subprocess.Popen(
        [str(tools.mapper_state()), "--state-id", state_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=clean_env(MAPPER_STATE_STATE_BACKEND__URI=backend.uri),
    )
    try:
        lease_file = (
            Path(backend.uri.removeprefix("file://")) / state_id / "mapper-state.lease.json"
        )
        deadline = time.monotonic() + 60
        while not lease_file.exists():
            assert time.monotonic() < deadline, "the filter never took the lease"
            time.sleep(0.1)
        yield holder
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)


def test_state_set_waits_for_a_filter_holding_the_lease_then_names_it(
    tmp_path: Path, meltano_addon: Path, file_backend: Backend
) -> None:
    project = project_for(tmp_path / "p", meltano_addon, file_backend)
    project.ok("set", "--force", "dev:held", singer({"bookmarks": {"s1": {"id": 1}}}))
    with filter_holding(file_backend, "dev:held") as holder:
        refused = project.state(
            "set",
            "--force",
            "dev:held",
            singer({"bookmarks": {"s1": {"id": 2}}}),
            MELTANO_STATE_BACKEND_LOCK_WAIT_SECONDS="2",
        )
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "Traceback" not in refused.stderr
        assert "is busy after waiting 2s: held by run" in refused.stderr
        assert f"(pid {holder.pid})" in refused.stderr
        assert stored(file_backend, "dev:held") == {"bookmarks": {"s1": {"id": 1}}}
    project.ok("set", "--force", "dev:held", singer({"bookmarks": {"s1": {"id": 3}}}))
    assert stored(file_backend, "dev:held") == {"bookmarks": {"s1": {"id": 3}}}


# -- meltano run ------------------------------------------------------------------------------


def run_project(root: Path, data: Path, launcher: Path, backend: Backend) -> AddonProject:
    base = make_project(root, data, state_backend={"uri": backend.addon_uri})
    return AddonProject(base.root, {**base.env, **backend.env}, launcher=launcher)


@pytest.mark.parametrize(
    ("backend", "pipeline"),
    [
        ("file_backend", PIPELINE),
        pytest.param("s3_backend", ("tap-sample", "target-jsonl"), marks=pytest.mark.cloud),
    ],
    ids=["file-with-the-mapper", "s3-the-add-on-alone"],
    indirect=["backend"],
)
def test_incremental_runs(
    tmp_path: Path, meltano_addon: Path, backend: Backend, pipeline: tuple[str, ...]
) -> None:
    """``meltano run`` twice, the tap resuming from the state the add-on kept. With the mapper
    plugin in the run, Meltano's state writes go through under the run's lease (no wait)."""
    data = tmp_path / "events.jsonl"
    add_rows(data, 10)
    project = run_project(tmp_path / "project", data, meltano_addon, backend)
    first = project.run(*pipeline)
    assert first.returncode == 0, first.stderr
    assert delivered(project.output) == list(range(1, 11))
    assert "is busy" not in first.stderr, first.stderr
    assert "Traceback" not in first.stderr, first.stderr
    assert stored(backend, STATE_ID) == bookmark(data, 10)
    add_rows(data, 3)
    second = project.run(*pipeline)
    assert second.returncode == 0, second.stderr
    assert delivered(project.output) == list(range(1, 14))
    assert stored(backend, STATE_ID) == bookmark(data, 13)
    store = backend.open()
    try:
        kept = [s.value for s in history.list_snapshots(store, STATE_ID)]
    finally:
        store.close()
    assert kept[-1] == bookmark(data, 13)


def test_two_runs_started_together_exactly_one_runs(
    tmp_path: Path, meltano_addon: Path, file_backend: Backend
) -> None:
    """Two projects (two machines, say) run one pipeline on a shared store: the mapper's
    lease lets exactly one run at a time, so no row is loaded twice and the state is the
    winner's."""
    data = tmp_path / "events.jsonl"
    add_rows(data, 20)
    projects = [
        run_project(tmp_path / f"project-{n}", data, meltano_addon, file_backend) for n in range(2)
    ]
    for project in projects:  # a fresh project's database, created before the race
        project.ok("list")
    procs = [project.spawn("run", *PIPELINE, log=project.root / "run.log") for project in projects]
    codes = [p.wait(timeout=600) for p in procs]
    logs = "".join((project.root / "run.log").read_text() for project in projects)
    # every row loaded exactly once: the runs overlapped and one was refused at once, or
    # (on a slow machine) the second started after the first and resumed from its state
    rows = [row for project in projects for row in delivered(project.output)]
    assert sorted(rows) == list(range(1, 21)), logs
    if any(code != 0 for code in codes):
        assert sorted(code == 0 for code in codes) == [False, True], logs
        assert "is busy" in logs, logs
    assert stored(file_backend, STATE_ID) == bookmark(data, 20)


def beside_meltano(code: str) -> str:
    """What Python ``code`` prints, run by our Python with Meltano's packages importable
    after ours."""
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.append({str(MELTANO_SITE)!r})\n" + code],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_an_older_meltano_is_refused_with_the_version_it_needs() -> None:
    from mapper_state.meltano.backend_schemes import MINIMUM_MELTANO

    code = (
        "from mapper_state.meltano.backend import check_meltano_version as c\n"
        "c('3.7.0'); c('4.4.1'); c('5.0.0')\n"
        "try:\n    c('3.6.0')\nexcept Exception as e:\n    print(e)\n"
    )
    printed = beside_meltano(code)
    needed = ".".join(map(str, MINIMUM_MELTANO))
    assert needed == "3.7"
    assert f"needs Meltano {needed} or newer (found 3.6.0)" in printed


def test_a_relative_file_uri_is_the_projects_from_any_directory(
    tmp_path: Path, meltano_addon: Path, file_backend: Backend
) -> None:
    """`mapper-state+file://.meltano/state` is the project's `.meltano/state`, for the add-on
    and for plain mapper-state, whichever directory `meltano` is started in."""
    root = tmp_path / "project"
    project = project_for(root, meltano_addon, file_backend, "mapper-state+file://.meltano/state")
    assert project.cwd != project.root  # `meltano` starts in a subdirectory
    project.ok("set", "--force", "dev:rel", singer({"bookmarks": {"s": {"x": 1}}}))
    assert (root / ".meltano" / "state" / "dev:rel" / "state.json").is_file()
    assert not (project.cwd / ".meltano").exists()
    assert "dev:rel" in project.ok("list")
    uri = f"file://{root}/.meltano/state"
    ours = Backend("file", uri, {}, lambda: open_store(uri))
    assert stored(ours, "dev:rel") == {"bookmarks": {"s": {"x": 1}}}  # and the store closed


# -- Meltano's meaning of a state, kept ------------------------------------------------------


def exported(project: AddonProject) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(project.ok("export"))
    return found


def mapper_state_get(backend: Backend, state_id: str) -> Any:
    result = subprocess.run(
        [str(tools.mapper_state()), "state", "get", state_id],
        capture_output=True,
        text=True,
        check=False,
        env=clean_env(MAPPER_STATE_STATE_BACKEND__URI=backend.uri, **backend.env),
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("backend", HEAVY, indirect=True)
def test_partial_and_completed_halves_stay_apart(
    tmp_path: Path, meltano_addon: Path, backend: Backend
) -> None:
    """A state Meltano writes as partial comes back as partial (`meltano state export`), while
    mapper-state reads the effective state, partial merged over completed."""
    project = project_for(tmp_path / "p", meltano_addon, backend)
    project.ok("merge", "dev:p", singer({"bookmarks": {"s1": {"id": 1}}}))  # a partial write
    project.ok("set", "--force", "dev:q", singer({"bookmarks": {"s1": {"id": 2}}}))
    project.ok("merge", "dev:q", singer({"bookmarks": {"s2": {"id": 3}}}))
    both = {"bookmarks": {"s1": {"id": 2}, "s2": {"id": 3}}}
    assert json.loads(project.ok("get", "dev:q")) == {"singer_state": both}
    assert mapper_state_get(backend, "dev:q") == both
    assert mapper_state_get(backend, "dev:p") == {"bookmarks": {"s1": {"id": 1}}}
    tools.require_meltano("`meltano state export`")
    assert exported(project)["dev:p"] == {
        "completed": {},
        "partial": {"singer_state": {"bookmarks": {"s1": {"id": 1}}}},
    }
    assert exported(project)["dev:q"] == {
        "completed": {"singer_state": {"bookmarks": {"s1": {"id": 2}}}},
        "partial": {"singer_state": {"bookmarks": {"s2": {"id": 3}}}},
    }
    # the split survives an export and an import
    dump = project.root / "export.json"
    dump.write_text(project.ok("export"))
    project.ok("clear", "--force", "--all")
    project.ok("import", str(dump))
    assert exported(project)["dev:q"]["partial"] == {
        "singer_state": {"bookmarks": {"s2": {"id": 3}}}
    }


def test_an_empty_state_reads_back_empty(
    tmp_path: Path, meltano_addon: Path, file_backend: Backend
) -> None:
    tools.require_meltano("`meltano state import`")
    project = project_for(tmp_path / "p", meltano_addon, file_backend)
    dump = project.root / "empty.json"
    dump.write_text(json.dumps({"dev:e": {"completed": {}, "partial": {}}}))
    project.ok("import", str(dump))
    assert json.loads(project.ok("get", "dev:e")) == {}
    assert exported(project) == {"dev:e": {"completed": {}, "partial": {}}}


def test_state_set_writes_what_the_operator_said(
    tmp_path: Path, meltano_addon: Path, file_backend: Backend
) -> None:
    """`meltano state set --force` overwrites as Meltano's own backends do: a dropped stream
    is dropped, an empty state replaces bookmarks, `--no-validate` keys are kept; each prior
    state stays in the history."""
    project = project_for(tmp_path / "p", meltano_addon, file_backend)
    two = {"bookmarks": {"s1": {"id": 1}, "s2": {"id": 2}}}
    project.ok("set", "--force", "dev:o", singer(two))
    one = {"bookmarks": {"s1": {"id": 5}}}
    project.ok("set", "--force", "dev:o", singer(one))
    assert stored(file_backend, "dev:o") == one
    project.ok("set", "--force", "dev:o", singer({}))
    assert json.loads(project.ok("get", "dev:o")) == {"singer_state": {}}
    store = file_backend.open()
    try:
        kept = [s.value for s in history.list_snapshots(store, "dev:o")]
    finally:
        store.close()
    assert kept[:3] == [two, one, {}]
    tools.require_meltano("`meltano state set --no-validate`")
    project.ok("set", "--force", "--no-validate", "dev:o", json.dumps({"other": {"x": 1}}))
    assert json.loads(project.ok("get", "dev:o")) == {"other": {"x": 1}}


def test_a_runs_write_keeps_the_empty_state_guard(
    tmp_path: Path, meltano_addon: Path, file_backend: Backend
) -> None:
    """Outside a `meltano state` command (a run's write), an empty state over bookmarks is
    still refused and the stored state stays."""
    project = project_for(tmp_path / "p", meltano_addon, file_backend)
    kept = {"bookmarks": {"s1": {"id": 1}}}
    project.ok("set", "--force", "dev:g", singer(kept))
    code = (
        "from mapper_state.meltano.backend import MapperStateBackend\n"
        "from meltano.core.state_store import MeltanoState\n"
        f"b = MapperStateBackend(uri={file_backend.addon_uri!r})\n"
        "b.update(MeltanoState('dev:g', {}, {'singer_state': {}}))\n"
    )
    result = subprocess.run(
        [str(meltano_addon.parent / "python"), "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env=project.env,
        cwd=project.root,
    )
    assert result.returncode == 6, result.stderr
    assert "not committing a state without bookmarks" in result.stderr
    assert stored(file_backend, "dev:g") == kept


def test_import_writes_nothing_when_a_state_is_busy(
    tmp_path: Path, meltano_addon: Path, file_backend: Backend
) -> None:
    tools.require_meltano("`meltano state import`")
    project = project_for(tmp_path / "p", meltano_addon, file_backend)
    with filter_holding(file_backend, "dev:b2"):
        doc = {
            sid: {"completed": {"singer_state": {"bookmarks": {"s": {"id": n}}}}, "partial": {}}
            for n, sid in enumerate(("dev:b1", "dev:b2", "dev:b3"))
        }
        dump = project.root / "import.json"
        dump.write_text(json.dumps(doc))
        refused = project.state("import", str(dump))
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "state ID dev:b2 is busy" in refused.stderr
        assert "no state was written" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert [stored(file_backend, s) for s in ("dev:b1", "dev:b3")] == [None, None]


def test_list_and_upgrade_say_which_store_they_read(
    tmp_path: Path, meltano_addon: Path, file_backend: Backend
) -> None:
    """After switching stores, `meltano state list` names the store it listed;
    `meltano upgrade` says what it moved, and where."""
    project = project_for(tmp_path / "p", meltano_addon, file_backend)
    listed = project.state("list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == ""
    assert f"no states in mapper-state {file_backend.uri}" in listed.stderr
    store = file_backend.open()
    try:
        doc = {"run_id": "old", "singer_state": {"bookmarks": {"s": {"id": 1}}}}
        store.create("dev:u/history/20200101T000000.000000Z-old.json", json.dumps(doc).encode())
    finally:
        store.close()
    tools.require_meltano("`meltano upgrade` calling the add-on's `migrate`")
    upgraded = project.meltano("upgrade", "--skip-package")
    assert upgraded.returncode == 0, upgraded.stderr
    said = f"mapper-state {file_backend.uri}: moved 1 history snapshot to {history.HISTORY_ROOT}"
    assert said in upgraded.stdout + upgraded.stderr


@pytest.mark.cloud
@pytest.mark.parametrize("backend", ["s3_backend"], indirect=True)
def test_errors_name_the_addons_settings(
    tmp_path: Path, meltano_addon: Path, backend: Backend
) -> None:
    project = project_for(tmp_path / "p", meltano_addon, backend)
    bad = project.state("list", MELTANO_STATE_BACKEND_MAPPER_STATE_S3_SERVER_SIDE_ENCRYPTION="x")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "setting state_backend.mapper-state+s3.server_side_encryption must be" in bad.stderr
    assert "state_backend.s3." not in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_missing_library_is_installed_where_meltano_runs() -> None:
    """The hint fits how Meltano was installed: `uv tool`, pipx, or a virtualenv's pip."""
    code = (
        "from mapper_state.meltano.backend import in_addon_words as w\n"
        "m = \"library is missing: boto3 (pip install 'mapper-state[s3]')\"\n"
        "print(w(m, '/home/u/.local/share/uv/tools/meltano'))\n"
        "print(w(m, '/home/u/.local/pipx/venvs/meltano'))\n"
        "print(w(m, '/opt/meltano-venv'))\n"
        "print(w('set state_backend.s3.region (or AWS_REGION)'))\n"
    )
    printed = beside_meltano(code)
    assert printed.splitlines() == [
        "library is missing: boto3 (uv tool install --reinstall meltano --with 'mapper-state[s3]')",
        "library is missing: boto3 (pipx inject meltano 'mapper-state[s3]')",
        "library is missing: boto3 (/opt/meltano-venv/bin/python -m pip install 'mapper-state[s3]')",
        "set state_backend.mapper-state+s3.region (or AWS_REGION)",
    ]


#: Meltano's side of a run whose mapper holds the lease, then loses it to ``lock break``
#: before Meltano writes: run by the add-on's Python, with ``WRITE`` the write to attempt.
UNDER_A_BROKEN_RUN_LEASE = """
import json, os, subprocess, sys, time
from pathlib import Path
from mapper_state.meltano.backend import MapperStateBackend
from meltano.core.state_store import MeltanoState
addon_uri, uri, state_id, write = sys.argv[1:]
mapper = str(Path(sys.executable).parent / "mapper-state")
lease = Path(uri.removeprefix("file://")) / state_id / "mapper-state.lease.json"
b = MapperStateBackend(uri=addon_uri)
child = subprocess.Popen(
    [mapper, "--state-id", state_id, "--state-backend-uri", uri, "--lock-timeout-seconds", "60"],
    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
)
deadline = time.monotonic() + 60
while not (lease.exists() and json.loads(lease.read_text()).get("pid") == child.pid):
    assert time.monotonic() < deadline, "the mapper never took the lease"
    time.sleep(0.1)
try:
    with b.acquire_lock(state_id, retry_seconds=1):  # the run's own lease: its mapper's
        subprocess.run([mapper, "lock", "break", state_id, "--yes", "--state-backend-uri", uri],
                       check=True, capture_output=True)
        if write == "set":
            b.set(MeltanoState(state_id, None, {"singer_state": {"bookmarks": {"s1": {"id": 2}}}}))
        else:
            b.delete(state_id)
    print("written")
finally:
    child.stdin.close()
    child.wait()
"""


@pytest.mark.parametrize("write", ["set", "delete"])
def test_a_runs_write_after_its_lease_was_broken_is_refused(
    tmp_path: Path, meltano_addon: Path, file_backend: Backend, write: str
) -> None:
    """Inside a run, Meltano writes under the lease its mapper holds; once that lease is
    broken, its write or its delete is refused and the state stays. Nobody else wrote the
    state, so only the confirmation of the lease before the write can refuse it."""
    project = project_for(tmp_path / "p", meltano_addon, file_backend)
    kept = {"bookmarks": {"s1": {"id": 1}}}
    project.ok("set", "--force", "dev:g", singer(kept))
    result = subprocess.run(
        [str(meltano_addon.parent / "python"), "-c", UNDER_A_BROKEN_RUN_LEASE,
         file_backend.addon_uri, file_backend.uri, "dev:g", write],
        capture_output=True, text=True, check=False, env=project.env, cwd=project.root,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 4, result.stdout + result.stderr  # LeaseLost, as Meltano shows it
    assert "written" not in result.stdout
    assert "the lease of this run on dev:g is gone or about to expire" in result.stderr
    assert "not writing" in result.stderr
    assert stored(file_backend, "dev:g") == kept


def test_a_state_changed_behind_the_lease_is_not_overwritten_by_the_add_on(tmp_path: Path) -> None:
    """A writer that ignores leases (Meltano's own backend on a machine not yet switched, a
    hand edit) changes ``state.json`` between the add-on's read under its lease and its
    write: the write is refused (exit 4, the compare-and-swap on the version read under the
    lease), and the other writer's state stays."""
    root, state_id = tmp_path / "states", "dev:a-to-b"
    path = root / state_id / state.STATE_FILE

    def doc(n: int) -> dict[str, Any]:
        return {"completed": {"singer_state": {"bookmarks": {"s": {"id": n}}}}, "partial": {}}

    code = (
        "import json, pathlib\n"
        "from meltano.core.state_store.base import MeltanoState\n"
        "from mapper_state.meltano.backend import MapperStateBackend\n"
        f"b = MapperStateBackend(uri='mapper-state+file://{root}')\n"
        "def meltano_state(d):\n"
        f"    return MeltanoState({state_id!r}, d['completed'], d['partial'])\n"
        f"b.set(meltano_state({doc(1)!r}))\n"
        f"with b.acquire_lock({state_id!r}, retry_seconds=1):\n"
        f"    b.get({state_id!r})\n"
        f"    pathlib.Path({str(path)!r}).write_text(json.dumps({doc(9)!r}))\n"
        "    try:\n"
        f"        b.set(meltano_state({doc(2)!r}))\n"
        "    except SystemExit as e:\n"
        "        print('refused with exit', e.code)\n"
        "b.close()\n"
    )
    assert "refused with exit 4" in beside_meltano(code).splitlines()
    assert json.loads(path.read_text()) == doc(9)


def test_a_clear_after_another_writer_changed_the_state_is_refused(tmp_path: Path) -> None:
    """``meltano state clear`` deletes only the state it read under its lease: a writer that
    ignores leases changed ``state.json`` after that read, so the delete is refused as a
    ``set`` is (exit 4: the delete is conditional on the version read) and that writer's
    state stays. A delete that ignored the version would remove it."""
    root, state_id = tmp_path / "states", "dev:a-to-b"
    path = root / state_id / state.STATE_FILE

    def doc(n: int) -> dict[str, Any]:
        return {"completed": {"singer_state": {"bookmarks": {"s": {"id": n}}}}, "partial": {}}

    code = (
        "import json, pathlib\n"
        "from meltano.core.state_store.base import MeltanoState\n"
        "from mapper_state.meltano.backend import MapperStateBackend\n"
        f"b = MapperStateBackend(uri='mapper-state+file://{root}')\n"
        f"b.set(MeltanoState({state_id!r}, {doc(1)['completed']!r}, {{}}))\n"
        f"with b.acquire_lock({state_id!r}, retry_seconds=1):\n"
        f"    b.get({state_id!r})\n"
        f"    pathlib.Path({str(path)!r}).write_text(json.dumps({doc(9)!r}))\n"
        "    try:\n"
        f"        b.delete({state_id!r})\n"
        "    except SystemExit as e:\n"
        "        print('refused with exit', e.code)\n"
        "b.close()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.append({str(MELTANO_SITE)!r})\n" + code],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "refused with exit 4" in result.stdout.splitlines(), result.stdout + result.stderr
    assert "changed by another writer; not clearing it" in result.stderr, result.stderr
    assert json.loads(path.read_text()) == doc(9)
