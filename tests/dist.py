"""The release as a stranger gets it: the sdist and the wheel, and the wheel installed.

Session fixtures:

* ``built_dist``: ``uv build`` (sdist, then the wheel built from that sdist) run on a
  copy of the checkout's files in a temporary directory, so no ``build/``,
  ``dist/`` or ``*.egg-info`` is left in the checkout;
* ``installed_wheel``: a fresh virtualenv outside the checkout with
  ``<wheel>[s3]`` installed by ``uv pip install``, and a way to run its
  ``mapper-state`` from a directory outside the checkout with nothing of the
  source tree importable.

A missing ``uv`` fails the test with the command that installs it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT = 300
INSTALL_TIMEOUT = 600


def uv() -> str:
    found = shutil.which("uv")
    if found is None:
        pytest.fail("uv is not on PATH: python3 -m pip install uv (make setup does)", pytrace=False)
    return found


def uv_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["UV_PYTHON_DOWNLOADS"] = "never"  # use this machine's interpreter
    env["UV_COMPILE_BYTECODE"] = "1"  # each Meltano or mapper-state start reads, not compiles
    return env


#: Folders that are not source, when there is no git to ask: what .gitignore lists
#: (``examples/data``, ``benchmarks/results``...), by name.
NOT_SOURCE = frozenset(
    {
        ".git",
        ".venv",
        ".tools",
        ".hypothesis",
        ".mapper-state",
        ".meltano",
        "build",
        "dist",
        "node_modules",
        "output",
        "results",
        "data",
    }
)


def checkout_files() -> list[str]:
    """The checkout's files as a commit would hold them (tracked, or new and not ignored)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        paths = [p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        paths = [
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if not NOT_SOURCE & set(p.relative_to(ROOT).parts)
            and "__pycache__" not in p.parts
            and not any(part.endswith((".egg-info", "_cache")) for part in p.parts)
        ]
    return [p for p in paths if (ROOT / p).is_file() and not (ROOT / p).is_symlink()]


def copy_checkout(dest: Path) -> Path:
    for rel in checkout_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    return dest


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path


@pytest.fixture(scope="session")
def built_dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """The sdist and the wheel that ``uv build`` makes from the checkout's files (once for
    the run, whichever worker asks first)."""

    def build(work: Path) -> None:
        source = copy_checkout(work / "source")
        _uv([uv(), "build", "--out-dir", str(work / "dist"), str(source)], work, BUILD_TIMEOUT)

    out = built_once(tmp_path_factory, "build", build) / "dist"
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return Dist(sdist, wheel)


def _uv(argv: list[str], cwd: Path, timeout: float) -> None:
    """Run a ``uv`` command; fail the test with the end of its stderr if it fails."""
    result = subprocess.run(
        argv, cwd=cwd, env=uv_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{argv} failed:\n{result.stderr[-4000:]}"


def install_in_venv(
    venv: Path, *requirement: str, python: str = sys.executable, timeout: float = INSTALL_TIMEOUT
) -> None:
    """``uv venv`` at ``venv`` with ``python``, then ``uv pip install`` with the arguments
    ``requirement`` (the requirement and any option) into it."""
    for argv in (
        [uv(), "venv", "--quiet", "--python", python, str(venv)],
        [uv(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *requirement],
    ):
        _uv(argv, venv.parent, timeout)


@dataclass(frozen=True)
class Installed:
    """The wheel installed outside the checkout, and the way to run it there."""

    venv: Path  # the virtualenv holding the wheel
    cwd: Path  # a directory outside the checkout to run in

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment: no settings, no PYTHONPATH, the venv first on PATH."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MAPPER_STATE_", "MELTANO_", "AWS_", "AZURE_", "GOOGLE_"))
            and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH")
        }
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env.update(extra)
        return env

    def run(
        self, *args: str, input: bytes = b"", env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """``mapper-state ARGS`` from the installed wheel."""
        return subprocess.run(
            [str(self.bin / "mapper-state"), *args],
            input=input,
            capture_output=True,
            cwd=self.cwd,
            env=env or self.env(),
            timeout=120,
            check=False,
        )

    def python(self, code: str) -> str:
        result = subprocess.run(
            [str(self.bin / "python"), "-c", code],
            capture_output=True,
            text=True,
            cwd=self.cwd,
            env=self.env(),
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``build(path)`` once for the whole test run, however many workers ask: the first
    builds under a lock, the others wait for it and use what it built. ``path`` is in the
    run's temporary directory (outside the checkout), which pytest removes in a later run."""
    shared = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's directory, above each worker's own
    path = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = path / ".built"
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            build(path)
            done.touch()
    assert ROOT not in path.parents, f"{path} is inside the checkout {ROOT}"
    return path


def outside_checkout() -> Path:
    """A temporary directory that is not inside the checkout."""
    path = Path(tempfile.mkdtemp(prefix="mapper-state-release-")).resolve()
    assert ROOT not in path.parents, f"{path} is inside the checkout {ROOT}"
    return path


@pytest.fixture(scope="session")
def installed_wheel(built_dist: Dist) -> Iterator[Installed]:
    """``uv venv`` outside the checkout and ``uv pip install '<wheel>[s3]'`` into it."""
    root = outside_checkout()
    venv = root / "venv"
    try:
        install_in_venv(venv, f"{built_dist.wheel}[s3]")
        cwd = root / "work"
        cwd.mkdir()
        yield Installed(venv, cwd)
    finally:
        shutil.rmtree(root, ignore_errors=True)
