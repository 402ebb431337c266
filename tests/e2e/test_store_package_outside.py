"""A store package from outside the tree, installed beside the wheel with no checkout.

The SQLite store of ``tests/fixtures/sqlite-store`` is copied outside the checkout and
installed with the project's wheel into fresh virtualenvs:

* with ``mapper-state[testing]``, its own contract test (``sqlite_contract.py``: the two
  fixtures and ``from mapper_state.testing import StoreContract, LeaseContract``) passes;
* beside the real Meltano, it is Meltano's state backend ``mapper-state+sqlite://``
  through the entry points its ``pyproject.toml`` declares (printed by
  ``python -m mapper_state.meltano.backend_schemes``), and plain mapper-state reads what
  Meltano wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.dist import Dist, Installed, install_in_venv, outside_checkout, uv, uv_env
from tests.e2e import tools
from tests.e2e.test_meltano import Project

pytestmark = [pytest.mark.e2e, pytest.mark.wheel]

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "sqlite-store"
MELTANO_SITE = tools.TOOLS_DIR / "meltano" / "lib" / "python3.11" / "site-packages"


def _store_source(root: Path) -> Path:
    source = root / "sqlite-store"
    shutil.copytree(FIXTURE, source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return source


@pytest.fixture(scope="module")
def with_store(built_dist: Dist) -> Iterator[tuple[Installed, Path]]:
    """A venv holding ``<wheel>[testing]`` and the SQLite store, and the store's source."""
    root = outside_checkout()
    try:
        source = _store_source(root)
        install_in_venv(root / "venv", f"{built_dist.wheel}[testing]", str(source))
        (root / "work").mkdir()
        yield Installed(root / "venv", root / "work"), source
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_store_package_passes_the_shipped_contract(
    with_store: tuple[Installed, Path],
) -> None:
    installed, source = with_store
    shutil.copy(source / "sqlite_contract.py", installed.cwd)
    nothing_of_the_checkout = installed.python(
        "import importlib.util as u, mapper_state.testing as t, sqlite_store as s;"
        "print(u.find_spec('tests') is None, t.__file__, s.__file__)"
    )
    found, testing, store = nothing_of_the_checkout.split()
    assert found == "True"
    assert testing.startswith(str(installed.venv)), testing
    assert store.startswith(str(installed.venv)), store
    run = subprocess.run(
        [str(installed.bin / "pytest"), "-q", "-p", "no:cacheprovider", "sqlite_contract.py"],
        cwd=installed.cwd,
        env=installed.env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert " passed" in run.stdout
    assert "failed" not in run.stdout


@pytest.fixture(scope="module")
def meltano_with_store(built_dist: Dist) -> Iterator[tuple[Path, Path]]:
    """``meltano`` of a venv seeing Meltano 4.4.1, with the wheel and the SQLite store in it;
    and that venv's ``bin``."""
    real = tools.meltano()
    root = outside_checkout()
    venv = root / "venv"
    python = Path(os.path.realpath(real.parent / "python"))
    try:
        pins = subprocess.run(
            [uv(), "pip", "freeze", "--python", str(real.parent / "python")],
            capture_output=True,
            text=True,
            check=True,
            env=uv_env(),
        ).stdout
        (root / "meltano-pins.txt").write_text(pins)
        constraint = ["--constraint", str(root / "meltano-pins.txt")]
        source = _store_source(root)
        install_in_venv(venv, *constraint, str(built_dist.wheel), str(source), python=str(python))
        site = next((venv / "lib").glob("python3*/site-packages"))
        (site / "zz-meltano.pth").write_text(f"{MELTANO_SITE}\n")
        launcher = venv / "bin" / "meltano"
        launcher.write_text(
            f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom meltano.cli import main\n"
            "sys.exit(main())\n"
        )
        launcher.chmod(0o755)
        yield launcher, venv / "bin"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _ok(project: Project, *args: str) -> str:
    result = project.meltano("--log-level=warning", *args, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


class _Project(Project):
    launcher: Path = Path()

    def executable(self) -> Path:
        return self.launcher


def test_a_store_package_is_a_meltano_state_backend(
    tmp_path: Path, meltano_with_store: tuple[Path, Path]
) -> None:
    launcher, bin_dir = meltano_with_store
    db = tmp_path / "state.db"
    root = tmp_path / "project"
    (root / "elsewhere").mkdir(parents=True)
    doc = tools.meltano_project(root, {})
    doc["state_backend"] = {
        "uri": f"mapper-state+sqlite://{db}",
        "lock_timeout_seconds": 10,
        "mapper-state+sqlite": {"busy_timeout": 5},
    }
    (root / "meltano.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    env = tools.tool_env(
        MELTANO_SEND_ANONYMOUS_USAGE_STATS="false", MELTANO_CLI_DISABLE_VERSION_CHECK="true"
    )
    project = _Project(root, env)
    project.launcher = launcher

    first = {"bookmarks": {"s1": {"id": 1}}}
    _ok(project, "state", "set", "--force", "dev:a", json.dumps({"singer_state": first}))
    second = {"bookmarks": {"s2": {"id": 2}}}
    _ok(project, "state", "merge", "dev:a", json.dumps({"singer_state": second}))
    both = {"bookmarks": {"s1": {"id": 1}, "s2": {"id": 2}}}
    assert json.loads(_ok(project, "state", "get", "dev:a")) == {"singer_state": both}
    assert _ok(project, "state", "list").split() == ["dev:a"]
    settings = _ok(project, "config", "list", "meltano")
    assert "state_backend.mapper-state+sqlite.busy_timeout" in settings

    # plain mapper-state, on the store's own URI, reads what Meltano wrote
    get = ["state", "get", "dev:a", "--state-backend-uri", f"sqlite://{db}"]
    got = subprocess.run(
        [str(bin_dir / "mapper-state"), *get],
        capture_output=True,
        text=True,
        env=tools.tool_env(),
        timeout=120,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == both
