"""The Meltano plugin definition, used as a stranger would: real Meltano 4.4.1, the wheel.

In a fresh project (a minimal ``meltano.yml`` with the sample tap and target-jsonl as
custom plugins), ``meltano add --plugin-type mapper mapper-state --from-ref <file>``
with the repository's plugin definition, its ``pip_url`` pointed at the wheel ``uv
build`` made: Meltano installs the wheel into its own virtualenv under
``.meltano/mappers/``. Then a mapping, and ``meltano run tap-sample remote-state
target-jsonl`` twice: the second run delivers only the new rows.

Meltano 4.x takes the plugin type as ``--plugin-type``; ``meltano add mapper
mapper-state`` (the 3.x form, which the test uses on 3.x) adds two plugins named ``mapper``
and ``mapper-state`` there.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dist import Dist
from tests.e2e import tools
from tests.e2e.test_meltano import add_rows, bookmark, delivered
from tests.support import lease, meltano_fork

pytestmark = [pytest.mark.e2e, pytest.mark.wheel]

DEFINITION = tools.REPO_ROOT / "plugins" / "mappers" / "mapper-state--mapper-state.yml"
STATE_ID = "dev:tap-sample-to-target-jsonl"
PIPELINE = ("tap-sample", "remote-state", "target-jsonl")


class Project:
    def __init__(self, root: Path, data: Path) -> None:
        self.root = root
        root.mkdir(parents=True)
        self.env = tools.tool_env(
            MELTANO_SEND_ANONYMOUS_USAGE_STATS="false",
            MELTANO_CLI_DISABLE_VERSION_CHECK="true",
        )
        doc = tools.meltano_project(
            root,
            {
                "extractors": [
                    {
                        "name": "tap-sample",
                        "namespace": "tap_sample",
                        "executable": str(tools.project_bin("tap-sample")),
                        "capabilities": ["catalog", "discover", "state", "about"],
                        "config": {"data_path": str(data)},
                    }
                ],
                "loaders": [
                    {
                        "name": "target-jsonl",
                        "namespace": "target_jsonl",
                        "executable": str(tools.target_jsonl()),
                        "config": {
                            "destination_path": str(self.output),
                            "do_timestamp_file": False,
                        },
                    }
                ],
            },
        )
        self.write(doc)

    @property
    def output(self) -> Path:
        return self.root / "output"

    def read(self) -> dict[str, Any]:
        return yaml.safe_load((self.root / "meltano.yml").read_text())  # type: ignore[no-any-return]

    def write(self, doc: dict[str, Any]) -> None:
        (self.root / "meltano.yml").write_text(yaml.safe_dump(doc, sort_keys=False))

    def meltano(
        self, *args: str, timeout: float = 300, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return meltano_fork.run(
            tools.meltano(), args, cwd=self.root, env={**self.env, **env}, timeout=timeout
        )


def definition_for(wheel: Path, dest: Path) -> Path:
    """The repository's plugin definition with ``pip_url`` pointing at the built wheel."""
    doc = yaml.safe_load(DEFINITION.read_text())
    assert doc["pip_url"] == "mapper-state"
    doc["pip_url"] = str(wheel)
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


def _added_as_defined(
    project: Project, built_dist: Dist, tmp_path: Path
) -> tuple[dict[str, Any], Path]:
    """Meltano kept the definition (every setting, its kind and sensitive flag) and installed
    the wheel in a virtualenv of its own; the project's document and that virtualenv."""
    doc = project.read()
    (mapper,) = doc["plugins"]["mappers"]
    assert mapper["name"] == "mapper-state"
    assert mapper["pip_url"] == str(built_dist.wheel)
    assert mapper["settings"] == yaml.safe_load(DEFINITION.read_text())["settings"]
    assert "utilities" not in doc["plugins"]
    venv = project.root / ".meltano" / "mappers" / "mapper-state" / "venv"
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import mapper_state; print(mapper_state.__file__)"],
        cwd=tmp_path,
        env=project.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert venv in Path(where).parents, where
    assert (venv / "bin" / "mapper-state").is_file()
    return doc, venv


def _plugin_env(project: Project) -> dict[str, str]:
    """The project's environment, with the store Meltano's plugin writes to (its state folder)."""
    return {
        **project.env,
        "MAPPER_STATE_STATE_BACKEND__URI": f"file://{project.root}/.meltano/state",
    }


def test_meltano_adds_the_plugin_from_its_definition_and_runs_it_incrementally(
    built_dist: Dist, tmp_path: Path
) -> None:
    data = tmp_path / "events.jsonl"
    add_rows(data, 10)
    project = Project(tmp_path / "project", data)
    ref = definition_for(built_dist.wheel, tmp_path / "mapper-state.yml")

    started = time.monotonic()
    added = project.meltano(*tools.add_mapper_args("mapper-state"), "--from-ref", str(ref))
    add_seconds = time.monotonic() - started
    assert added.returncode == 0, added.stdout + added.stderr
    print(f"meltano add (installing the wheel): {add_seconds:.1f}s")

    doc, venv = _added_as_defined(project, built_dist, tmp_path)
    (mapper,) = doc["plugins"]["mappers"]
    mapper["mappings"] = [{"name": "remote-state", "config": {"state_id": STATE_ID}}]
    project.write(doc)

    # the settings as Meltano shows them, secrets redacted
    listed = project.meltano(
        "--log-level=warning",
        *tools.config_args("list", "remote-state"),
        MAPPER_STATE_STATE_BACKEND_S3_AWS_SECRET_ACCESS_KEY="very-secret-value",
    )
    assert listed.returncode == 0, listed.stderr
    assert "state_backend.s3.aws_secret_access_key" in listed.stdout
    assert "very-secret-value" not in listed.stdout

    first = project.meltano("run", *PIPELINE)
    assert first.returncode == 0, first.stderr
    assert delivered(project.output) == list(range(1, 11))
    assert "leaving state.json to Meltano (lock_only)" in first.stderr
    wait_until_the_plugin_lets_go(venv, project)

    add_rows(data, 3)
    second = project.meltano("run", *PIPELINE)
    assert second.returncode == 0, second.stderr
    assert delivered(project.output) == [*range(1, 11), 11, 12, 13]  # only the new rows
    wait_until_the_plugin_lets_go(venv, project)

    state = project.meltano("--log-level=warning", "state", "get", STATE_ID)
    assert state.returncode == 0, state.stderr
    assert json.loads(state.stdout) == {"singer_state": bookmark(data, 13)}
    got = subprocess.run(
        [str(venv / "bin" / "mapper-state"), "state", "get", STATE_ID],
        cwd=tmp_path,
        env=_plugin_env(project),
        capture_output=True,
        text=True,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == bookmark(data, 13)


def wait_until_the_plugin_lets_go(venv: Path, project: Project) -> None:
    """The lease goes within moments of ``meltano run`` returning."""
    lease.wait_until_free(
        STATE_ID, _plugin_env(project), mapper_state=venv / "bin" / "mapper-state", timeout=15
    )
