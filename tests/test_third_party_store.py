"""A store from outside the project brings its own settings, through the entry-point group.

The tiny store in ``tests/fixtures/tiny-store`` is installed for real (pip builds its
wheel into a directory of its own, put on the child's ``PYTHONPATH``) and configured
with ``--set`` and with ``MAPPER_STATE_*`` variables, with no edit in mapper-state.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import clean_env, run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-store"
STATE = b'{"type": "STATE", "value": {"bookmarks": {"users": {"id": 7}}}}\n'


@pytest.fixture(scope="module")
def tiny_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the installed tiny-store distribution (its dist-info and module)."""
    site = tmp_path_factory.mktemp("tiny-site")
    build = tmp_path_factory.mktemp("tiny-src") / "tiny-store"
    shutil.copytree(FIXTURE, build)  # build outside the checkout: no egg-info left behind
    uv = shutil.which("uv")
    if uv:
        cmd = [uv, "pip", "install", "--quiet", "--no-deps", "--python", sys.executable]
        cmd += ["--target", str(site), str(build)]
    else:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
        cmd.append(str(build))
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    assert list(site.glob("tiny_store-*.dist-info")), "the tiny store was not installed"
    return site


def _env(site: Path, **extra: str) -> dict[str, str]:
    return clean_env(PYTHONPATH=str(site), **extra)


def _get_with_token(
    site: Path, root: Path, token: str, uri: str
) -> tuple[dict[str, str], subprocess.CompletedProcess[bytes]]:
    """``state get a`` on the tiny store at ``uri``, its token set in the environment: the
    environment, and the result."""
    env = _env(
        site,
        MAPPER_STATE_STATE_BACKEND__TINY__ROOT=str(root),
        MAPPER_STATE_STATE_BACKEND__TINY__TOKEN=token,
    )
    return env, run_cli("state", "get", "a", "--state-backend-uri", uri, env=env)


def test_a_third_party_store_is_configured_with_set_flags(tiny_site: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    flags = [
        "--state-backend-uri",
        "tiny://pipelines",
        "--set",
        f"state_backend.tiny.root={root}",
        "--set",
        "state_backend.tiny.token=tiny-token-value",
    ]
    run = run_cli(*flags, "--state-id", "a", input=STATE, env=_env(tiny_site))
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout == STATE
    doc = json.loads((root / "pipelines" / "a" / "state.json").read_bytes())
    assert doc["completed"]["singer_state"] == {"bookmarks": {"users": {"id": 7}}}

    got = run_cli("state", "get", "a", *flags, env=_env(tiny_site))
    assert got.returncode == 0, got.stderr.decode()
    assert json.loads(got.stdout) == {"bookmarks": {"users": {"id": 7}}}


def test_a_third_party_store_is_configured_from_the_environment(
    tiny_site: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    env = _env(
        tiny_site,
        MAPPER_STATE_STATE_BACKEND__URI="tiny://p",
        MAPPER_STATE_STATE_BACKEND__TINY__ROOT=str(root),
        MAPPER_STATE_STATE_BACKEND__TINY__TOKEN="tiny-token-value",
    )
    result = run_cli("state", "set", "b", '{"bookmarks": {}}', env=env)
    assert result.returncode == 0, result.stderr.decode()
    assert (root / "p" / "b" / "state.json").exists()
    listed = run_cli("state", "list", env=env)
    assert listed.stdout.decode().split() == ["b"]


def test_a_third_party_store_secret_is_redacted_and_listed_as_secret(
    tiny_site: Path, tmp_path: Path
) -> None:
    token = "refused-4f9a1c0de"  # the tiny store refuses tokens with this prefix, naming them
    _, result = _get_with_token(tiny_site, tmp_path, token, "tiny://x")
    assert result.returncode == 5
    err = result.stderr.decode()
    assert "tiny store refused the token ***" in err
    assert token not in err
    assert token not in result.stdout.decode()

    about = run_cli("--about", "--format", "json", env=_env(tiny_site))
    schema = json.loads(about.stdout)["settings"]["properties"]["state_backend"]["properties"]
    assert schema["tiny"]["properties"]["token"]["secret"] is True
    assert "secret" not in schema["tiny"]["properties"]["root"]
    text = run_cli("--about", env=_env(tiny_site)).stdout.decode()
    assert "MAPPER_STATE_STATE_BACKEND__TINY__TOKEN" in text


def test_an_unknown_setting_of_a_store_is_still_refused(tiny_site: Path, tmp_path: Path) -> None:
    result = run_cli(
        "state",
        "list",
        "--set",
        "state_backend.tiny.tokn=x",
        env=_env(tiny_site, HOME=os.fspath(tmp_path)),
    )
    assert result.returncode == 2
    assert "unknown setting state_backend.tiny.tokn" in result.stderr.decode()


def test_a_bug_in_a_store_is_exit_1_in_one_line_with_secrets_hidden(
    tiny_site: Path, tmp_path: Path
) -> None:
    token = "tiny-token-7d1e2f"
    env, result = _get_with_token(tiny_site, tmp_path, token, "tiny://crash")
    assert result.returncode == 1
    err = result.stderr.decode()
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert "internal error: RuntimeError: tiny store crashed holding the token ***" in err
    assert token not in err

    debug = run_cli(
        "state",
        "get",
        "a",
        "--state-backend-uri",
        "tiny://crash",
        env={**env, "MAPPER_STATE_DEBUG": "1"},
    )
    assert debug.returncode == 1
    assert b"Traceback" in debug.stderr
    assert token.encode() not in debug.stderr


@pytest.mark.parametrize("script", ["gen-reference.py", "gen-backend-entry-points.py"])
def test_the_generated_files_list_only_the_built_in_stores(tiny_site: Path, script: str) -> None:
    # a contributor with a store plugin installed: `make lint` checks the generated files
    about = run_cli("--about", env=_env(tiny_site)).stdout.decode()
    assert "MAPPER_STATE_STATE_BACKEND__TINY__TOKEN" in about  # the plugin is installed
    root = Path(__file__).resolve().parent.parent
    check = subprocess.run(
        [sys.executable, str(root / "scripts" / script), "--check"],
        capture_output=True,
        text=True,
        env=_env(tiny_site),
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
