"""Real Meltano 4.4.1 and mapper-state read a ``file://`` state backend URI alike.

Meltano keeps only a ``file://`` URI's path (``file://.meltano/state`` is ``/state``),
so mapper-state refuses a URI with a host from Meltano's variable, and the spelling it
proposes (``file://${MELTANO_PROJECT_ROOT}/...``) is where Meltano keeps the state.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.e2e import tools
from tests.support import meltano_fork


def meltano(project: Path, *args: str, cwd: Path | None = None, **env: str) -> None:
    result = meltano_fork.run(
        tools.meltano(), args, cwd=cwd or project, env=tools.tool_env(**env), timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]


def mapper(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(tools.mapper_state()), *args],
        cwd=cwd,
        env=tools.tool_env(**env),
        capture_output=True,
        timeout=120,
        check=False,
    )


def new_project(root: Path, uri: str) -> Path:
    doc = tools.meltano_project(root, {})
    doc["state_backend"] = {"uri": uri}
    (root / "meltano.yml").write_text(yaml.safe_dump(doc))
    (root / "sub").mkdir()
    return root / "sub"


def test_meltano_drops_a_file_uris_host_and_mapper_state_refuses_it(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    uri = f"file://somehost{kept}"
    sub = new_project(tmp_path, uri)
    meltano(tmp_path, "state", "set", "--force", "dev:a-to-b", '{"singer_state": {"n": 1}}')
    assert (kept / "dev:a-to-b" / "state.json").exists()  # the host is gone: only the path

    refused = mapper(sub, "state", "list", MELTANO_STATE_BACKEND_URI=uri)
    assert refused.returncode == 2
    assert "'somehost' as a host name" in refused.stderr.decode()


def test_the_proposed_project_spelling_is_where_meltano_keeps_state(tmp_path: Path) -> None:
    sub = new_project(tmp_path, "file://${MELTANO_PROJECT_ROOT}/.meltano/state")
    meltano(
        tmp_path, "state", "set", "--force", "dev:a-to-b", '{"singer_state": {"n": 2}}', cwd=sub
    )
    assert (tmp_path / ".meltano" / "state" / "dev:a-to-b" / "state.json").exists()

    # what a mapping run is given: the URI expanded, the project root, from a subdirectory
    got = mapper(
        sub,
        "state",
        "get",
        "dev:a-to-b",
        MELTANO_STATE_BACKEND_URI=f"file://{tmp_path}/.meltano/state",
        MELTANO_PROJECT_ROOT=str(tmp_path),
    )
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == {"n": 2}


def test_mapper_state_in_the_project_reads_the_states_meltano_keeps(tmp_path: Path) -> None:
    sub = new_project(tmp_path, "file://${MELTANO_PROJECT_ROOT}/.meltano/state")
    meltano(tmp_path, "state", "set", "--force", "dev:a-to-b", '{"singer_state": {"n": 3}}')

    # an operator in the project: no URI, no variable; meltano.yml names the store
    listed = mapper(sub, "state", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.decode().split() == ["dev:a-to-b"]
    assert f"state_backend.uri of {tmp_path / 'meltano.yml'}" in listed.stderr.decode()
    got = mapper(sub, "state", "get", "dev:a-to-b")
    assert json.loads(got.stdout) == {"n": 3}
