"""Locate the real Singer tools installed by ``scripts/install-tools.sh``.

Each tool lives in its own virtualenv under ``<repo>/.tools/<name>/`` because its pins
clash with the project's. These helpers return absolute paths and fail the test (never
skip it) with the command to run when a tool is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.dist import install_in_venv, uv, uv_env

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = Path(os.environ.get("MAPPER_STATE_TOOLS_DIR", REPO_ROOT / ".tools"))
INSTALL_HINT = "run `scripts/install-tools.sh` from the repository root"


def _versions() -> dict[str, str]:
    lines = (Path(__file__).with_name("meltano_versions.txt")).read_text().splitlines()
    pairs = (line.split() for line in lines if line.strip() and not line.startswith("#"))
    return {minor: version for minor, version in pairs}


#: The Meltano minors the add-on supports, oldest first, with the patch tested of each.
MELTANO_VERSIONS = _versions()
OLDEST_MELTANO, NEWEST_MELTANO = next(iter(MELTANO_VERSIONS)), list(MELTANO_VERSIONS)[-1]
#: The Meltano minor the Meltano tests run (``make test-meltano-versions`` sets each in turn).
MELTANO_MINOR = os.environ.get("MAPPER_STATE_MELTANO", NEWEST_MELTANO)

#: What the Meltano tests use of Meltano that an older supported minor lacks: the feature, as a
#: skip reason names it, and the first minor that has it. A test asks for a feature by its
#: name here (:func:`meltano_has`, :func:`require_meltano`), never for a version: where the
#: minor has another spelling of the same thing (:func:`add_mapper_args`), the test uses it;
#: where it has none, the test is skipped on that minor, naming the feature.
MELTANO_FEATURES = {
    "`meltano add --plugin-type`": "4.0",  # 3.x: `meltano add mapper NAME`
    "`meltano config list PLUGIN`": "4.0",  # 3.x: `meltano config PLUGIN list`
    "`meltano config print PLUGIN`": "4.0",  # 3.x: `meltano config PLUGIN`
    "`meltano state edit`": "4.0",
    "`meltano state set --no-validate`": "4.0",
    "`meltano upgrade` calling the add-on's `migrate`": "4.2",
    # 4.0 to 4.2 know the capability, but hand a mapper no `_log_parser`: its lines stay text
    "`structured-logging` for a mapper": "4.3",
    "`meltano state export`": "4.3",
    "`meltano state import`": "4.3",
    # 4.2 and older list their S3 backend with the URI's path as the key prefix, "/prefix":
    # no key starts with it, so `meltano state list` lists nothing (`get` and `set` work)
    "`meltano state list` finding the states under an s3:// URI's prefix": "4.3",
}


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def meltano_has(feature: str, minor: str | None = None) -> bool:
    """Does Meltano ``minor`` (default :data:`MELTANO_MINOR`) have ``feature``, a key of
    :data:`MELTANO_FEATURES`?"""
    return _minor(minor or MELTANO_MINOR) >= _minor(MELTANO_FEATURES[feature])


def require_meltano(feature: str) -> None:
    """Skip the rest of the current test where the Meltano it runs lacks ``feature``, with a
    reason naming the feature and the first minor that has it. Called where the test comes
    to the feature: whatever it checked before has run, and passed."""
    if not meltano_has(feature):
        since = MELTANO_FEATURES[feature]
        pytest.skip(f"Meltano {MELTANO_MINOR} has no {feature} ({since} added it)")


def add_mapper_args(name: str) -> tuple[str, ...]:
    """``meltano add`` of a mapper called ``name``, as the Meltano under test spells it
    (4.x's ``meltano add mapper NAME`` would add two plugins, ``mapper`` and ``NAME``)."""
    if meltano_has("`meltano add --plugin-type`"):
        return ("add", "--plugin-type", "mapper", name)
    return ("add", "mapper", name)


def config_args(command: str, plugin: str) -> tuple[str, ...]:
    """``meltano config list PLUGIN`` or ``meltano config print PLUGIN`` (``command``), as the
    Meltano under test spells it: 3.x's are ``meltano config PLUGIN list`` and
    ``meltano config PLUGIN``."""
    if meltano_has(f"`meltano config {command} PLUGIN`"):
        return ("config", command, plugin)
    return ("config", plugin, "list") if command == "list" else ("config", plugin)


def meltano_venv(minor: str | None = None) -> str:
    """The ``.tools`` venv of a Meltano minor: ``meltano`` for the newest, else ``meltano-<minor>``."""
    minor = minor or MELTANO_MINOR
    if minor not in MELTANO_VERSIONS:
        pytest.fail(f"Meltano {minor} is not in tests/e2e/meltano_versions.txt", pytrace=False)
    return "meltano" if minor == NEWEST_MELTANO else f"meltano-{minor}"


def meltano_site(minor: str | None = None) -> Path:
    """Meltano's own packages, which a venv of ours sees through a ``.pth`` file."""
    return TOOLS_DIR / meltano_venv(minor) / "lib" / "python3.11" / "site-packages"


MELTANO_SITE = meltano_site()

# venv name under .tools/ -> executables it provides
TOOLS: dict[str, tuple[str, ...]] = {
    "meltano": ("meltano",),
    "tap-postgres": ("tap-postgres",),
    "target-jsonl": ("target-jsonl",),
    "target-csv": ("target-csv",),
}


class ToolMissing(RuntimeError):
    pass


def tool_path(venv: str, exe: str | None = None) -> Path:
    """``.tools/<venv>/bin/<exe>`` (``exe`` defaults to ``venv``); raises ToolMissing."""
    exe = exe or venv
    path = TOOLS_DIR / venv / "bin" / exe
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ToolMissing(f"{path} not found: {INSTALL_HINT}")
    return path


def require_tool(venv: str, exe: str | None = None) -> Path:
    """Like :func:`tool_path`, but fails the current test with a clear message."""
    try:
        return tool_path(venv, exe)
    except ToolMissing as exc:
        pytest.fail(str(exc), pytrace=False)


def meltano(minor: str | None = None) -> Path:
    """Meltano of ``minor`` (default :data:`MELTANO_MINOR`); the older minors are installed by
    ``scripts/install-meltano-versions.sh``."""
    venv = meltano_venv(minor)
    if venv == "meltano":
        return require_tool("meltano")
    try:
        return tool_path(venv, "meltano")
    except ToolMissing as exc:
        pytest.fail(f"{exc} (scripts/install-meltano-versions.sh --all)", pytrace=False)


def tap_postgres() -> Path:
    return require_tool("tap-postgres")


def target_jsonl() -> Path:
    return require_tool("target-jsonl")


def target_csv() -> Path:
    return require_tool("target-csv")


def project_bin(exe: str) -> Path:
    """An executable of the project's own virtualenv (e.g. ``mapper-state``, ``tap-sample``)."""
    path = Path(sys.executable).parent / exe
    if path.is_file():
        return path
    found = shutil.which(exe)
    if found:
        return Path(found)
    pytest.fail(
        f"{exe} not found next to {sys.executable} nor on PATH: install the project "
        "(uv pip install -e '.[dev]') and, for tap-sample, `uv pip install -e examples/tap-sample`",
        pytrace=False,
    )


def mapper_state() -> Path:
    return project_bin("mapper-state")


def tool_env(**extra: str) -> dict[str, str]:
    """An environment for running a tool: ours, minus variables that would leak in."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MELTANO_", "MAPPER_STATE_", "TAP_", "TARGET_"))
        and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    env.update(extra)
    return env


def venv_seeing_meltano(venv: Path, *requirement: str, minor: str | None = None) -> None:
    """A venv at ``venv`` on Meltano's Python, with ``requirement`` installed under the
    pins of Meltano's own packages (kept beside it in ``meltano-pins.txt``), that sees
    Meltano's packages: Meltano's code runs there beside ours."""
    python = meltano(minor).parent / "python"
    pins = subprocess.run(
        [uv(), "pip", "freeze", "--python", str(python)],
        capture_output=True,
        text=True,
        check=True,
        env=uv_env(),
    ).stdout
    constraints = venv.parent / "meltano-pins.txt"
    constraints.write_text(pins)
    install_in_venv(
        venv, "--constraint", str(constraints), *requirement, python=os.path.realpath(python)
    )
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "zz-meltano.pth").write_text(f"{meltano_site(minor)}\n")


def meltano_project(root: Path, plugins: dict[str, Any]) -> dict[str, Any]:
    """``meltano.yml`` of a throw-away project at ``root``: one environment, ``dev``, no
    telemetry, Meltano's own state in a file backend inside the project."""
    return {
        "default_environment": "dev",
        "project_id": str(uuid.uuid4()),
        "send_anonymous_usage_stats": False,
        "environments": [{"name": "dev"}],
        "state_backend": {"uri": f"file://{root}/.meltano/state"},
        "plugins": plugins,
    }
