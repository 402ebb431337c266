"""The Dockerfile's entrypoint, run as a container would run it (no Docker here)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from tests.helpers import MAPPER, clean_env, stored_state

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def test_copied_paths_exist() -> None:
    for keyword, rest in dockerfile_instructions():
        if keyword == "COPY":
            *sources, _dest = shlex.split(rest)
            for source in sources:
                assert (ROOT / source).exists(), source


def test_entrypoint_runs_the_job_from_environment_only(tmp_path: Path) -> None:
    instructions = dockerfile_instructions()
    entrypoint = json.loads(next(rest for kw, rest in instructions if kw == "ENTRYPOINT"))
    assert entrypoint[:1] == ["mapper-state"]
    env = clean_env()
    for keyword, rest in instructions:
        if keyword == "ENV":
            name, _, value = rest.partition("=")
            env[name] = value
    env.update(
        MAPPER_STATE_STATE_ID="prod:tiny-to-tiny",
        MAPPER_STATE_STATE_BACKEND__URI=f"file://{tmp_path / 'bucket'}",
        MAPPER_STATE_TAP=f"{sys.executable} {FIXTURES / 'tiny_tap.py'}",
        MAPPER_STATE_TARGET=f"{sys.executable} {FIXTURES / 'tiny_target.py'} {tmp_path / 'out'}",
    )
    result = subprocess.run(
        [MAPPER, *entrypoint[1:]],
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
