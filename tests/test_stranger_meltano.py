"""What a Meltano user reads: the YAML to add for a missing ID, and a busy run's one error."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import run_cli, spawn_cli, wait_for_lease
from tests.support.meltano import mapping_env as meltano_env

MELTANO_ID = "dev:tap-sample-to-target-jsonl"
STREAM = b'{"type": "STATE", "value": {"bookmarks": {"events": 1}}}\n'
#: A shell that runs its arguments as a command, and exits when that command does.
SHELL_PARENT = ("sh", "-c", '"$0" "$@"')


def as_mapping(
    project: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[bytes]:
    """The mapper under a short-lived parent standing in for Meltano (the keeper waits on it)."""
    return run_cli(*args, input=STREAM, cwd=project, env=env, timeout=60, parent=SHELL_PARENT)


def test_a_missing_state_id_shows_yaml_that_can_be_pasted(tmp_path: Path) -> None:
    env = meltano_env(tmp_path, f"file://{tmp_path}/.meltano/state")
    result = as_mapping(tmp_path, env)
    assert result.returncode == 2, result.stderr
    first, *block = result.stderr.decode().splitlines()
    assert first.startswith("mapper-state: error: setting state_id is missing in the Meltano")
    assert "add it to meltano.yml as below, with your loader's name" in first
    pasted: dict[str, Any] = yaml.safe_load("\n".join(row[4:] for row in block))
    assert pasted == {
        "plugins": {
            "mappers": [
                {
                    "name": "mapper-state",
                    "mappings": [
                        {
                            "name": "remote-state",
                            "config": {"state_id": "dev:tap-sample-to-<loader>"},
                        }
                    ],
                }
            ]
        }
    }


def test_a_busy_mapper_says_only_that_it_is_busy(tmp_path: Path) -> None:
    store = tmp_path / ".meltano" / "state"
    env = meltano_env(tmp_path, f"file://{store}")
    holder = spawn_cli("--state-id", MELTANO_ID, "--state-backend-uri", f"file://{store}")
    wait_for_lease(store, MELTANO_ID)
    busy = as_mapping(tmp_path, env, "--state-id", MELTANO_ID)
    assert busy.returncode == 3, busy.stderr
    err = busy.stderr.decode()
    assert "is busy" in err
    assert "holding its lease" not in err
    holder.communicate(b"")
    assert holder.returncode == 0
    # once the lease is free, the run that holds it says so
    free = as_mapping(tmp_path, env, "--state-id", MELTANO_ID)
    assert free.returncode == 0, free.stderr
    assert f"{MELTANO_ID} is Meltano's own state: holding its lease for the run" in (
        free.stderr.decode()
    )


def test_a_state_id_meltano_left_unexpanded_is_expanded_as_meltano_would(tmp_path: Path) -> None:
    """Meltano 3.7 hands a mapping's config over as it is: the ID the docs recommend,
    ``${MELTANO_ENVIRONMENT}:...``, is Meltano's own ID once expanded from the mapper's
    environment (so the mapper only guards it), and a variable that is not set is an error
    naming it, never a literal ``${...}`` state ID."""
    store = tmp_path / ".meltano" / "state"
    env = meltano_env(tmp_path, f"file://{store}")
    config = tmp_path / "mapping.json"
    config.write_text('{"state_id": "${MELTANO_ENVIRONMENT}:tap-sample-to-target-jsonl"}')
    ran = as_mapping(tmp_path, env, "--config", str(config))
    assert ran.returncode == 0, ran.stderr
    assert f"{MELTANO_ID} is Meltano's own state: holding its lease" in ran.stderr.decode()
    # the run records beside the states aside, the one state ID in the store is Meltano's
    assert sorted(p.name for p in store.iterdir() if p.name != ".mapper-state") == [MELTANO_ID]

    config.write_text('{"state_id": "${MELTANO_NOT_SET}:tap-sample-to-target-jsonl"}')
    refused = as_mapping(tmp_path, env, "--config", str(config))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count(b"\n") == 1, refused.stderr
    assert b"${MELTANO_NOT_SET}, which is not set" in refused.stderr

    # outside a Meltano mapping nothing is expanded: the shell does that
    plain = run_cli(
        "--config",
        str(config),
        input=STREAM,
        cwd=tmp_path,
        env=env | {"MELTANO_MAP__MAPPING_NAME": ""},
    )
    assert plain.returncode == 0, plain.stderr
    assert b"state_id=${MELTANO_NOT_SET}:tap-sample-to-target-jsonl" in plain.stderr
