"""The fork server the suite starts ``meltano`` commands from gives what the executable gives.

``tests/support/meltano_fork.py`` saves each command Meltano's import; these checks hold it
to ``subprocess.run`` of the executable itself: the same exit status, the same output, the
command's own working directory and environment, and its stdin.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e import tools
from tests.support import meltano_fork

pytestmark = pytest.mark.e2e


def both(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[object, object]:
    launcher = tools.meltano()
    forked = meltano_fork.run(launcher, args, cwd=cwd, env=env, timeout=120)
    direct = subprocess.run(
        [str(launcher), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    return (forked.returncode, forked.stdout), (direct.returncode, direct.stdout)


def test_a_forked_command_exits_and_prints_as_the_executable_does(tmp_path: Path) -> None:
    env = tools.tool_env(MELTANO_SEND_ANONYMOUS_USAGE_STATS="false")
    forked, direct = both(["--version"], tmp_path, env)
    assert forked == direct
    assert "meltano, version 4.4.1" in str(forked)
    forked, direct = both(["no-such-command"], tmp_path, env)
    assert forked == direct == (2, "")


def test_a_forked_command_has_its_own_directory_environment_and_stdin(tmp_path: Path) -> None:
    (tmp_path / "meltano.yml").write_text(
        "version: 1\nproject_id: fork-check\ndefault_environment: dev\nenvironments:\n- name: dev\n"
    )
    env = tools.tool_env(
        MELTANO_SEND_ANONYMOUS_USAGE_STATS="false",
        MELTANO_STATE_BACKEND_URI=f"file://{tmp_path / 'states'}",
    )
    document = '{"dev:a": {"completed": {"singer_state": {"n": 1}}, "partial": {}}}'
    imported = meltano_fork.run(
        tools.meltano(), ["state", "import"], cwd=tmp_path, env=env,
        input=document.encode(), timeout=120,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    got = meltano_fork.run(
        tools.meltano(), ["--log-level=warning", "state", "get", "dev:a"], cwd=tmp_path, env=env,
        timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == '{"singer_state":{"n":1}}'
    assert (tmp_path / "states" / "dev:a").is_dir()  # the environment's backend, in its cwd


def test_a_spawned_command_writes_its_log_and_exits_as_the_executable_does(
    tmp_path: Path,
) -> None:
    env = tools.tool_env(MELTANO_SEND_ANONYMOUS_USAGE_STATS="false")
    ok = meltano_fork.spawn(tools.meltano(), ["--version"], cwd=tmp_path, env=env,
                            log=tmp_path / "ok.log", new_session=True)  # fmt: skip
    assert ok.wait(timeout=120) == 0
    assert ok.poll() == 0
    assert "meltano, version 4.4.1" in (tmp_path / "ok.log").read_text()
    bad = meltano_fork.spawn(tools.meltano(), ["no-such-command"], cwd=tmp_path, env=env,
                             log=tmp_path / "bad.log")  # fmt: skip
    assert bad.wait(timeout=120) == 2
    assert "No such command 'no-such-command'" in (tmp_path / "bad.log").read_text()
