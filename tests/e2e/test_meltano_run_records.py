"""A ``meltano run`` under the add-on's whole-run lease leaves its run record, as the filter,
``run`` and ``exec`` do: Meltano 4.4.1 with the project's wheel (the ``meltano_addon``
fixture), ``state_backend.uri: mapper-state+file://...`` only, no mapper plugin."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_meltano import add_rows
from tests.e2e.test_meltano_backend import (  # noqa: F401 - fixtures used by name
    Backend,
    file_backend,
    meltano_addon,
    run_project,
)
from tests.support.processes import MAPPER, clean_env

pytestmark = pytest.mark.e2e

EL = ("tap-sample", "target-jsonl")
STATE_ID = "dev:tap-sample-to-target-jsonl"


def test_a_meltano_run_is_recorded_with_how_it_ended(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    data = tmp_path / "events.jsonl"
    add_rows(data, 5)
    project = run_project(tmp_path / "project", data, meltano_addon, file_backend)
    ok = project.run(*EL)
    assert ok.returncode == 0, ok.stderr
    data.unlink()  # the tap cannot read its data: the next run fails
    failed = project.run(*EL)
    assert failed.returncode != 0, failed.stderr

    shown = subprocess.run(
        [MAPPER, "runs", STATE_ID, "--format", "json", "--state-backend-uri", file_backend.uri],
        env=clean_env(),
        capture_output=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    newest, first = json.loads(shown.stdout)
    assert (first["mode"], first["outcome"], first["exit_code"]) == ("meltano", "succeeded", 0)
    assert (newest["mode"], newest["outcome"]) == ("meltano", "failed")
    assert newest["exit_code"] != 0
    assert newest["ended_at"] is not None
    assert "meltano" in newest["command"]
