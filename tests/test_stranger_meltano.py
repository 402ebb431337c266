"""What a Meltano user reads: the YAML to add for a missing ID, and a busy run's one error."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import MAPPER, clean_env, spawn_cli, wait_for_lease

MELTANO_ID = "dev:tap-sample-to-target-jsonl"
STREAM = b'{"type": "STATE", "value": {"bookmarks": {"events": 1}}}\n'


def meltano_env(project: Path, backend: str) -> dict[str, str]:
    """The variables Meltano 4.4.1 gives a mapping (docs/real-tools.md)."""
    return clean_env(
        MELTANO_PROJECT_ROOT=str(project),
        MELTANO_SYS_DIR_ROOT=str(project / ".meltano"),
        MELTANO_ENVIRONMENT="dev",
        MELTANO_EXTRACTOR_NAME="tap-sample",
        MELTANO_MAPPER_NAME="mapper-state",
        MELTANO_MAP__MAPPING_NAME="remote-state",
        MELTANO_STATE_BACKEND_URI=backend,
    )


def as_mapping(
    project: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[bytes]:
    """The mapper under a short-lived parent standing in for Meltano (the keeper waits on it)."""
    return subprocess.run(
        ["sh", "-c", '"$0" "$@"', MAPPER, *args],
        input=STREAM,
        capture_output=True,
        cwd=project,
        env=env,
        timeout=60,
        check=False,
    )


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
