"""The add-on and the whole-run lease on every Meltano minor the add-on supports.

Each test runs against a real Meltano of each minor (``tests/e2e/meltano_versions.txt``,
installed by ``scripts/install-meltano-versions.sh``) with the project's wheel in its venv.
The default suite runs the oldest minor here (the newest runs the whole of
``test_meltano_backend.py``, ``test_meltano_run_lease.py`` and the mapper plugin's tests);
``MAPPER_STATE_MELTANO_VERSIONS=all`` (``make test-meltano-versions``) runs every minor here,
and that target runs the other modules once per minor too.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.dist import Dist
from tests.e2e import tools
from tests.e2e.test_meltano_backend import (  # noqa: F401 - fixtures used by name
    HEAVY,
    AddonProject,
    Backend,
    addon_launcher,
    backend,
    file_backend,
    project_for,
    singer,
    stored,
)
from tests.e2e.test_meltano_run_lease import EL, STATE_ID, machines, race

pytestmark = pytest.mark.e2e

ALL = os.environ.get("MAPPER_STATE_MELTANO_VERSIONS") == "all"
MINORS = list(tools.MELTANO_VERSIONS) if ALL else [tools.OLDEST_MELTANO]
#: The fake of a Meltano whose hook moved: both ends by default, every minor with ``all``.
HOOK_MINORS = list(tools.MELTANO_VERSIONS) if ALL else [tools.OLDEST_MELTANO, tools.NEWEST_MELTANO]
UNGUARDED = 13
BUSY = 3


@pytest.fixture(params=MINORS, ids=lambda m: f"meltano-{m}")
def minor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def launcher(tmp_path_factory: pytest.TempPathFactory, built_dist: Dist, minor: str) -> Path:
    return addon_launcher(tmp_path_factory, built_dist, minor)


def in_meltano(launcher: Path, code: str) -> str:
    """What Python ``code`` prints in the add-on's venv of a Meltano."""
    result = subprocess.run(
        [str(launcher.parent / "python"), "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env=tools.tool_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_internal_the_hook_uses_is_found(launcher: Path, minor: str) -> None:
    """The Meltano internals of the whole-run hook, checked in one place, are all there:
    on a new release, this test names the one that moved."""
    code = (
        "import json\nfrom mapper_state.meltano import internals\n"
        "print(json.dumps({a.internal.name: a.problem for a in internals.check()}))\n"
        "print(internals.meltano_version())\n"
    )
    answers_line, version = in_meltano(launcher, code).splitlines()
    assert version == tools.MELTANO_VERSIONS[minor]
    answers = json.loads(answers_line)
    assert len(answers) >= 10, answers
    assert {name: problem for name, problem in answers.items() if problem} == {}


def test_installing_it_breaks_no_meltano_command(
    tmp_path: Path, launcher: Path, minor: str
) -> None:
    """With mapper-state in Meltano's venv and the add-on not in use: ``meltano init``, then
    commands of the new project, run as without it; the add-on's settings are listed."""
    env = tools.tool_env(
        MELTANO_SEND_ANONYMOUS_USAGE_STATS="false", MELTANO_CLI_DISABLE_VERSION_CHECK="true"
    )

    def meltano(*args: str, cwd: Path) -> str:
        result = subprocess.run(
            [str(launcher), *args], cwd=cwd, env=env, capture_output=True, text=True,
            timeout=180, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        return result.stdout

    meltano("init", "fresh", "--no_usage_stats", cwd=tmp_path)
    project = tmp_path / "fresh"
    # Meltano 4.0 turned `meltano config PLUGIN list` into `meltano config list PLUGIN`; 4.3
    # lists the configured settings only, unless `--all`
    order = ["meltano", "list"] if minor.startswith("3.") else ["list", "meltano"]
    if tuple(map(int, minor.split("."))) >= (4, 3):
        order.append("--all")
    listed = meltano("config", *order, cwd=project)
    assert "state_backend.lock_wait_seconds" in listed, listed
    assert "state_backend.mapper-state+s3.region" in listed, listed
    meltano("state", "list", cwd=project)


@pytest.mark.parametrize("backend", HEAVY, indirect=True)
def test_two_machines_one_pipeline_exactly_one_runs(
    tmp_path: Path,
    launcher: Path,
    backend: Backend,  # noqa: F811
) -> None:
    """Two ``meltano run`` of one pipeline on two machines sharing a store, with only the
    one-line change: one runs, the other exits 3 naming the holder, its tap never started."""
    pair = machines(tmp_path, launcher, backend)
    result = race(pair, ())
    assert sorted(result.codes) == [0, BUSY], result
    winner = result.codes.index(0)
    assert result.syncs[winner] == 1, result
    assert result.starts[1 - winner] == 0, result


def _state_round(project: AddonProject, backend: Backend) -> None:  # noqa: F811
    a = {"bookmarks": {"s1": {"id": 1}}}
    project.ok("set", "--force", "dev:a", singer(a))
    project.ok("merge", "dev:a", singer({"bookmarks": {"s2": {"id": 2}}}))
    both = {"bookmarks": {"s1": {"id": 1}, "s2": {"id": 2}}}
    assert json.loads(project.ok("get", "dev:a")) == {"singer_state": both}
    assert stored(backend, "dev:a") == both
    project.ok("copy", "--force", "dev:a", "dev:b")
    assert project.ok("list").split() == ["dev:a", "dev:b"]
    project.ok("clear", "--force", "dev:a")
    assert stored(backend, "dev:a") is None
    assert project.ok("list").split() == ["dev:b"]


@pytest.mark.parametrize("backend", HEAVY, indirect=True)
def test_state_commands(tmp_path: Path, launcher: Path, backend: Backend) -> None:  # noqa: F811
    """``meltano state set/merge/get/copy/list/clear`` through the add-on."""
    _state_round(project_for(tmp_path / "project", launcher, backend), backend)


def test_a_state_written_under_the_oldest_reads_back_under_the_newest_and_back(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    built_dist: Dist,
    file_backend: Backend,  # noqa: F811
) -> None:
    """Users upgrade Meltano with their states in place (and sometimes step back)."""
    old = project_for(
        tmp_path / "old",
        addon_launcher(tmp_path_factory, built_dist, tools.OLDEST_MELTANO),
        file_backend,
    )
    new = project_for(
        tmp_path / "new",
        addon_launcher(tmp_path_factory, built_dist, tools.NEWEST_MELTANO),
        file_backend,
    )
    first = {"bookmarks": {"s1": {"id": 1}}}
    old.ok("set", "--force", "dev:a", singer(first))
    assert json.loads(new.ok("get", "dev:a")) == {"singer_state": first}
    new.ok("merge", "dev:a", singer({"bookmarks": {"s2": {"id": 2}}}))
    both = {"singer_state": {"bookmarks": {"s1": {"id": 1}, "s2": {"id": 2}}}}
    assert json.loads(old.ok("get", "dev:a")) == both
    assert old.ok("list").split() == new.ok("list").split() == ["dev:a"]


# -- a Meltano whose hook moved ---------------------------------------------------------------

#: Run by Meltano's Python at start-up (``PYTHONPATH``): the real Meltano, with one internal the
#: hook uses removed, as a release that renamed it would be. Meltano's own state service keeps
#: the function it imported, so Meltano itself works; the plugins' Pythons lack Meltano and
#: skip it.
MOVED = """\
try:
    import meltano.core.state_service
    import meltano.core.state_store
except ImportError:
    pass
else:
    del meltano.core.state_store.state_store_manager_from_project_settings
"""


@pytest.mark.parametrize("hook_minor", HOOK_MINORS, ids=lambda m: f"meltano-{m}")
@pytest.mark.parametrize("require", [False, True], ids=["warns", "refuses"])
def test_a_meltano_whose_hook_moved_says_so_or_refuses(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    built_dist: Dist,
    file_backend: Backend,  # noqa: F811
    hook_minor: str,
    require: bool,
) -> None:
    """On a Meltano without an internal the hook needs, a run never goes on silently
    unguarded: one warning naming the internal and the version and ``mapper-state exec``,
    or, with ``state_backend.require_run_lease``, exit 13 before the tap starts."""
    launcher = addon_launcher(tmp_path_factory, built_dist, hook_minor)
    (m,) = machines(tmp_path, launcher, file_backend, count=1)
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "sitecustomize.py").write_text(MOVED)
    env = {**m.project.env, "PYTHONPATH": str(moved)}
    if require:
        env["MELTANO_STATE_BACKEND_REQUIRE_RUN_LEASE"] = "true"
    result = subprocess.run(
        [str(launcher), "run", *EL], cwd=m.project.cwd, env=env, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    log = result.stdout + result.stderr
    assert "Traceback" not in log, log
    version = tools.MELTANO_VERSIONS[hook_minor]
    said = [line for line in log.splitlines() if "no whole-run lease" in line]
    assert len(said) == 1, log
    line = said[0]
    assert f"on Meltano {version}" in line, line
    assert "meltano.core.state_store:state_store_manager_from_project_settings" in line, line
    assert "mapper-state exec" in line, line
    if require:
        assert result.returncode == UNGUARDED, log
        assert line.startswith("mapper-state: error:"), line
        assert m.syncs() == 0, m.tap_starts()
        assert stored(file_backend, STATE_ID) is None
    else:
        assert result.returncode == 0, log
        assert line.startswith("mapper-state: warning:"), line
        assert m.syncs() == 1, m.tap_starts()
        assert stored(file_backend, STATE_ID) is not None
