"""Meltano's own state tests, from its 4.4.1 sdist, run against the add-on on files and on S3.

The sdist is fetched at test time with pip (``pip download --no-binary :all: --no-deps
meltano==4.4.1``, checked against its published hash) and unpacked in a temporary
directory; nothing of it is kept in the repository. Its tests run unchanged in a
virtualenv holding Meltano 4.4.1, the project's wheel and Meltano's test dependencies
(pinned to what Meltano's own virtualenv holds); only the fixtures that choose the
backend are ours (``tests/e2e/meltano_own/addon_conftest.py``, which also lists the tests
skipped and why). The counts go to the test's output (``-s``) and to docs/meltano.md.

On S3 the default suite runs Meltano's backend and state-service tests;
``MAPPER_STATE_MELTANO_BACKEND=full`` adds its ``meltano state`` command tests there too
(each one replays a job history through the store: minutes on moto).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.dist import Dist, built_once, uv_env
from tests.e2e import tools
from tests.e2e.meltano_own import addon_conftest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

MELTANO = "4.4.1"
#: The sdist's SHA-256 as the package index publishes it.
SDIST_SHA256 = "f6ea53b148b01aa94a47aea39134033f3757871042596dbf9ca59a71cd4cd45d"
FULL = os.environ.get("MAPPER_STATE_MELTANO_BACKEND") == "full"
OWN_TESTS = (
    "tests/meltano/core/state_store",
    "tests/meltano/core/test_state_service.py",
    "tests/meltano/cli/test_state.py",
)
#: Meltano's test dependencies its state tests import (its ``testing`` group, as pinned there).
TEST_DEPENDENCIES = (
    "pytest>=9",
    "faker>=37.4.2",
    "moto>=5.1.0,!=5.2.0",
    "pytest-asyncio>=1.4.0",
    "pytest-docker~=3.1",
    "pytest-order~=1.3",
    "pytest-structlog~=1.1",
    "pytest-xdist~=3.6",
    "requests-mock>=1.12.1,<2",
    "time-machine>=3",
    "colorama>=0.4.4,<0.5",
)
PIP_DOWNLOAD = ("download", "--quiet", "--no-binary", ":all:", "--no-deps")


def fetch_sources(root: Path) -> None:
    """Meltano's sdist, downloaded into ``root`` and checked, its tests unpacked there."""
    python = tools.require_tool("meltano", "python")
    fetched = subprocess.run(
        [str(python), "-m", "pip", *PIP_DOWNLOAD, "--dest", str(root), f"meltano=={MELTANO}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=uv_env(),
    )
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    (sdist,) = root.glob("meltano-*.tar.gz")
    assert hashlib.sha256(sdist.read_bytes()).hexdigest() == SDIST_SHA256, sdist
    with tarfile.open(sdist) as tar:
        top = f"meltano-{MELTANO}"
        members = [
            m for m in tar.getmembers() if m.name.startswith((f"{top}/tests/", f"{top}/pyproject"))
        ]
        # plain files and folders under the sdist's own folder only (tarfile's "data" filter
        # says the same where this Python has it: 3.11.4 and newer)
        unsafe = [
            m.name for m in members if ".." in Path(m.name).parts or not (m.isfile() or m.isdir())
        ]
        assert not unsafe, unsafe
        safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(root, members=members, **safe)


@pytest.fixture(scope="session")
def meltano_sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Meltano's sdist, downloaded and unpacked once for the run: the root of its tests
    (``tests/``, ``pyproject.toml``)."""
    return built_once(tmp_path_factory, "meltano-sources", fetch_sources) / f"meltano-{MELTANO}"


@pytest.fixture(scope="session")
def meltano_test_python(tmp_path_factory: pytest.TempPathFactory, built_dist: Dist) -> Path:
    """A Python seeing Meltano 4.4.1's packages, the project's wheel and Meltano's test
    tools, made once for the run."""

    def make(root: Path) -> None:
        tools.venv_seeing_meltano(root / "venv", f"{built_dist.wheel}[all]", *TEST_DEPENDENCIES)

    return built_once(tmp_path_factory, "meltano-tests-venv", make) / "venv" / "bin" / "python"


def run_own_tests(
    python: Path, sources: Path, store: str, env: dict[str, str], paths: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Meltano's tests at ``paths`` against the add-on on ``store``: one report line per test."""
    shutil.copy(Path(addon_conftest.__file__), sources / "tests" / "meltano" / "conftest.py")
    report = sources / f"report-{os.getpid()}-{abs(hash(store))}.jsonl"
    report.unlink(missing_ok=True)
    result = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths],
        cwd=sources,
        env=tools.tool_env(
            **env,
            MAPPER_STATE_MELTANO_TESTS_STORE=store,
            MAPPER_STATE_MELTANO_TESTS_REPORT=str(report),
        ),
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    assert report.exists(), result.stdout[-4000:] + result.stderr[-4000:]
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    failed = [line for line in lines if line["outcome"] == "failed"]
    assert not failed, "\n\n".join(f"{f['nodeid']}\n{f.get('error', '')}" for f in failed)
    assert result.returncode == 0, result.stdout[-4000:]
    return lines


def check_and_count(lines: list[dict[str, Any]], store: str) -> Counter[str]:
    counts = Counter(line["outcome"] for line in lines)
    skipped = [line for line in lines if line["outcome"] == "skipped"]
    for line in skipped:  # every skip is one of the harness's, with its reason
        assert "bound to Meltano's backend" in line.get("reason", ""), line
    print(
        f"Meltano {MELTANO}'s own state tests on mapper-state+{store}: "
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    )
    return counts


def test_meltanos_own_state_tests_pass_on_the_file_store(
    meltano_test_python: Path, meltano_sources: Path
) -> None:
    lines = run_own_tests(meltano_test_python, meltano_sources, "file", {}, OWN_TESTS)
    counts = check_and_count(lines, "file")
    assert counts["passed"] >= 85, counts  # the harness ran them (85 on 4.4.1)


@pytest.mark.cloud
def test_meltanos_own_state_tests_pass_on_s3(
    meltano_test_python: Path, meltano_sources: Path, s3_location: Any
) -> None:
    env = {k: v for k, v in s3_location.env.items() if k != "MAPPER_STATE_STATE_BACKEND__URI"}
    paths = OWN_TESTS if FULL else OWN_TESTS[:2]
    lines = run_own_tests(
        meltano_test_python, meltano_sources, f"mapper-state+{s3_location.uri}", env, paths
    )
    counts = check_and_count(lines, "s3")
    assert counts["passed"] >= (80 if FULL else 20), counts
