"""The Dockerfile, checked without a container engine: what it copies, how it installs, who
it runs as, and its entrypoint run as a container would run it. Where an engine works,
``tests/test_container.py`` builds the image and runs it for real.

The image is built from the wheel in ``dist/`` (``uv build`` first); ``tests/test_wheel.py``
checks that the wheel ``uv build`` makes matches the Dockerfile's COPY.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from unittest import mock

import pytest

from tests.helpers import MAPPER, TINY_TAP, clean_env, stored_state, tiny_target

ROOT = Path(__file__).resolve().parent.parent


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def instructions_of(keyword: str) -> list[str]:
    return [rest for kw, rest in dockerfile_instructions() if kw == keyword]


def copied_wheel_pattern() -> re.Pattern[str]:
    """The wheel file names the Dockerfile's only COPY takes from ``dist/``."""
    (copy,) = instructions_of("COPY")
    *sources, _dest = shlex.split(copy)
    (source,) = sources
    directory, _, pattern = source.rpartition("/")
    assert directory == "dist", source
    return re.compile(fnmatch.translate(pattern))


def test_it_copies_only_the_wheel_from_dist() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = project["name"].replace("-", "_")
    # what setuptools names the wheel of this pure-Python project
    wheel = f"{name}-{project['version']}-py3-none-any.whl"
    assert copied_wheel_pattern().match(wheel), wheel
    assert not copied_wheel_pattern().match(f"{name}-{project['version']}.tar.gz")
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignore = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", "the build context must hold the wheel alone"
    assert ignore[1:] == ["!" + shlex.split(instructions_of("COPY")[0])[0]]


def test_it_runs_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions()
    users = [i for i, (kw, _) in enumerate(instructions) if kw == "USER"]
    assert users, "no USER instruction: the container would run as root"
    user = instructions[users[-1]][1]
    assert user not in ("root", "0"), user
    assert not user.startswith(("root:", "0:")), user
    (run,) = instructions_of("RUN")
    assert f"useradd --create-home --uid 10001 {user}" in run
    entrypoint = next(i for i, (kw, _) in enumerate(instructions) if kw == "ENTRYPOINT")
    assert users[-1] < entrypoint
    assert not any(kw == "RUN" for kw, _ in instructions[users[-1] :])


def _run_install(
    tmp_path: Path, wheels: list[str], extras: str, plugins: str = "", *, base_has_tini: bool = True
) -> tuple[int, str, str]:
    """The Dockerfile's RUN, with /tmp/dist and the installers replaced by recording stand-ins
    (tests/test_container.py builds the image for real where a container engine works)."""
    (run,) = instructions_of("RUN")
    dist = tmp_path / "dist"
    dist.mkdir(parents=True)
    for wheel in wheels:
        (dist / wheel).write_bytes(b"")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    log = tmp_path / "calls"
    for tool in ("pip", "useradd", "apt-get"):
        stub = stubs / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >>"{log}"\n')
        stub.chmod(0o755)
    # `python -m venv DIR` makes DIR/bin with a recording pip and the plugin's executable
    (stubs / "python").write_text(
        f'#!/bin/sh\necho "python $*" >>"{log}"\nmkdir -p "$3/bin"\n'
        f'cp "{stubs}/pip" "$3/bin/pip"\ncp "{stubs}/pip" "$3/bin/$(basename "$3")"\n'
    )
    (stubs / "python").chmod(0o755)
    script = (
        run.replace("/tmp/dist", str(dist))
        .replace("/opt/plugins", str(tmp_path / "opt"))
        .replace("/usr/local/bin", str(tmp_path / "usr-local-bin"))
        .replace("command -v tini", "true" if base_has_tini else "false")
    )
    (tmp_path / "usr-local-bin").mkdir()
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "WHEELS": os.environ.get("WHEELS", ""),
        "EXTRAS": extras,
        "PLUGINS": plugins,
    }
    result = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    calls = log.read_text() if log.exists() else ""
    return result.returncode, calls, result.stderr


def test_it_installs_the_wheel_with_its_extras(tmp_path: Path) -> None:
    wheel = "mapper_state-0.1.0-py3-none-any.whl"
    code, calls, err = _run_install(tmp_path / "s3", [wheel], "s3")
    assert code == 0, err
    assert f"pip install --no-cache-dir {tmp_path}/s3/dist/{wheel}[s3]\n" in calls
    assert "useradd --create-home --uid 10001 elt" in calls
    assert not (tmp_path / "s3" / "dist").exists()  # the wheel does not stay in the image

    code, calls, err = _run_install(tmp_path / "none", [wheel], "")
    assert code == 0, err
    assert f"pip install --no-cache-dir {tmp_path}/none/dist/{wheel}\n" in calls


def test_it_installs_from_a_mounted_wheelhouse_alone(tmp_path: Path) -> None:
    wheel = "mapper_state-0.1.0-py3-none-any.whl"
    with mock.patch.dict(os.environ, {"WHEELS": "/wheels"}):
        code, calls, err = _run_install(tmp_path, [wheel], "s3")
    assert code == 0, err
    expected = (
        f"pip install --no-cache-dir --no-index --find-links /wheels {tmp_path}/dist/{wheel}[s3]"
    )
    assert expected + "\n" in calls


@pytest.mark.parametrize("has_tini", [True, False], ids=["base-has-tini", "python-slim"])
def test_it_installs_tini_where_the_base_lacks_it(tmp_path: Path, has_tini: bool) -> None:
    wheel = "mapper_state-0.1.0-py3-none-any.whl"
    code, calls, err = _run_install(tmp_path, [wheel], "", base_has_tini=has_tini)
    assert code == 0, err
    installs = "apt-get install -y --no-install-recommends tini\n" in calls
    assert installs is not has_tini, calls


TWO_WHEELS = ["mapper_state-0.1.0-py3-none-any.whl", "mapper_state-0.2.0-py3-none-any.whl"]


@pytest.mark.parametrize("wheels", [[], TWO_WHEELS], ids=["none", "two"])
def test_it_refuses_a_dist_without_exactly_one_wheel(tmp_path: Path, wheels: list[str]) -> None:
    code, calls, err = _run_install(tmp_path, wheels, "all")
    assert code != 0
    assert "dist/ must hold exactly one mapper-state wheel (run uv build)" in err
    assert "pip install" not in calls


def test_it_gives_each_plugin_a_virtualenv(tmp_path: Path) -> None:
    code, calls, err = _run_install(
        tmp_path, ["mapper_state-0.1.0-py3-none-any.whl"], "all", "target-jsonl tap-x"
    )
    assert code == 0, err
    for plugin in ("target-jsonl", "tap-x"):
        assert f"python -m venv {tmp_path}/opt/{plugin}\n" in calls
        assert f"pip install --no-cache-dir {plugin}\n" in calls
        linked = tmp_path / "usr-local-bin" / plugin  # on PATH in the image
        assert linked.resolve() == tmp_path / "opt" / plugin / "bin" / plugin


def test_entrypoint_runs_the_job_from_environment_only(tmp_path: Path) -> None:
    instructions = dockerfile_instructions()
    entrypoint = json.loads(next(rest for kw, rest in instructions if kw == "ENTRYPOINT"))
    command = json.loads(next(rest for kw, rest in instructions if kw == "CMD"))
    # tini as PID 1 (tests/test_container.py checks it in a running container), then
    # mapper-state with the default command `run`
    assert entrypoint[:3] == ["tini", "--", "mapper-state"], entrypoint
    assert command == ["run"], command
    env = clean_env()
    for keyword, rest in instructions:
        if keyword == "ENV":
            name, _, value = rest.partition("=")
            env[name] = value
    env.update(
        MAPPER_STATE_STATE_ID="prod:tiny-to-tiny",
        MAPPER_STATE_STATE_BACKEND__URI=f"file://{tmp_path / 'bucket'}",
        MAPPER_STATE_TAP=TINY_TAP,
        MAPPER_STATE_TARGET=tiny_target(tmp_path / "out"),
    )
    result = subprocess.run(
        [MAPPER, *entrypoint[3:], *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert stored_state(tmp_path / "bucket", "prod:tiny-to-tiny") == {"bookmarks": {"s": 3}}
    logs = [json.loads(line) for line in result.stderr.splitlines() if line.startswith(b"{")]
    assert any(entry["message"] == "run finished" for entry in logs)  # JSON logs in containers
