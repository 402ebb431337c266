"""A ``file://`` URI names one place, and messages name it absolutely."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import clean_env, run_cli


def test_meltano_file_uri_with_a_host_is_refused_with_the_two_spellings(tmp_path: Path) -> None:
    # Meltano reads `.meltano` as a host and keeps the state in /state: refuse, do not follow
    env = clean_env(MELTANO_STATE_BACKEND_URI="file://.meltano/state")
    result = run_cli("state", "list", cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert "'.meltano' as a host name" in lines[0]
    assert "in /state" in lines[0]
    assert "file:///absolute/path" in lines[0]
    assert "file://${MELTANO_PROJECT_ROOT}/.meltano/state" in lines[0]


def test_meltano_localhost_file_uri_is_the_absolute_path(tmp_path: Path) -> None:
    store = tmp_path / "meltano-state"
    (store / "dev:a-to-b").mkdir(parents=True)
    (store / "dev:a-to-b" / "state.json").write_text(
        json.dumps({"completed": {"singer_state": {"x": 1}}, "partial": {}})
    )
    env = clean_env(MELTANO_STATE_BACKEND_URI=f"file://localhost{store}")
    result = run_cli("state", "get", "dev:a-to-b", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"x": 1}


def test_an_empty_relative_store_names_the_directory_it_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_cli("state", "list", "--state-backend-uri", "file://relstore", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert f"no states in file://{elsewhere}/relstore" in result.stderr.decode()
    # the default store too
    result = run_cli("state", "list", cwd=elsewhere)
    assert f"no states in file://{elsewhere}/.mapper-state" in result.stderr.decode()


def test_a_relative_store_inside_a_meltano_project_is_the_projects(tmp_path: Path) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    env = clean_env(MELTANO_PROJECT_ROOT=str(tmp_path))
    uri = "file://.meltano/state"
    result = run_cli(
        "state", "set", "dev:a-to-b", '{"x": 2}', "--state-backend-uri", uri, cwd=sub, env=env
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / ".meltano" / "state" / "dev:a-to-b" / "state.json").exists()
    assert not (sub / ".meltano").exists()


def test_the_add_ons_relative_file_uri_is_the_projects_for_the_mapper_too(tmp_path: Path) -> None:
    """Meltano hands the mapper `mapper-state+file://.meltano/state`: the same place the add-on
    reads (the project's), not the directory `meltano` was started in."""
    sub = tmp_path / "sub"
    sub.mkdir()
    env = clean_env(
        MELTANO_PROJECT_ROOT=str(tmp_path),
        MELTANO_STATE_BACKEND_URI="mapper-state+file://.meltano/state",
    )
    result = run_cli("state", "set", "dev:a-to-b", '{"x": 2}', cwd=sub, env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / ".meltano" / "state" / "dev:a-to-b" / "state.json").exists()
    assert not (sub / ".meltano").exists()
