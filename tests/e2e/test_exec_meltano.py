"""``meltano state set`` inside ``mapper-state exec``: the add-on writes under the exec's lease.

Meltano 4.4.1 with the project's wheel in its venv (the ``meltano_addon`` fixture of
``test_meltano_backend``), ``state_backend.uri`` set to ``mapper-state+file://...``. Inside
the exec, Meltano's state write goes through under the exec's lease (its run ID in the
history); outside, the same command is refused naming the holder.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from mapper_state.core import history
from tests.e2e.test_meltano_backend import (  # noqa: F401 - fixtures used by name
    Backend,
    file_backend,
    meltano_addon,
    project_for,
    singer,
    stored,
)
from tests.helpers import MAPPER, wait_until

pytestmark = pytest.mark.e2e

ID = "dev:exec"


def test_meltano_state_set_inside_exec_writes_under_its_lease_and_outside_is_refused(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    project = project_for(tmp_path / "p", meltano_addon, file_backend)
    project.ok("list")  # the project's system database, made before the exec
    log, gate = tmp_path / "log", tmp_path / "go"
    inside = {"bookmarks": {"s1": {"id": 1}}}
    meltano = f"{shlex.quote(str(meltano_addon))} --log-level=warning state set --force"
    script = (
        f"{meltano} {ID} {shlex.quote(singer(inside))} 2>> {log} && echo set >> {log}; "
        f"echo done >> {log}; while [ ! -e {gate} ]; do sleep 0.05; done"
    )
    exec_args = ["exec", "--state-id", ID, "--state-backend-uri", file_backend.uri]
    wrapper = subprocess.Popen(
        [MAPPER, *exec_args, "--", "sh", "-c", script],
        cwd=project.cwd,
        env=project.env,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: log.exists() and "done" in log.read_text(), "meltano never ended", 300)
        assert log.read_text().splitlines() == ["set", "done"], log.read_text()
        assert stored(file_backend, ID) == inside
        outside = project.state(
            "set",
            "--force",
            ID,
            singer({"bookmarks": {"s1": {"id": 2}}}),
            MAPPER_STATE_STATE_BACKEND__LOCK_WAIT_SECONDS="0",
        )
        assert outside.returncode == 3, outside.stdout + outside.stderr
        assert "Traceback" not in outside.stderr
        assert f"(pid {wrapper.pid})" in outside.stderr
        assert stored(file_backend, ID) == inside
    finally:
        gate.touch()
        _, err = wrapper.communicate(timeout=60)
    assert wrapper.returncode == 0, err
    store = file_backend.open()
    try:
        snapshots = history.list_snapshots(store, ID)
    finally:
        store.close()
    assert [s.value for s in snapshots] == [inside]
    run_ids = {s.run_id for s in snapshots}
    assert len(run_ids) == 1
    assert run_ids.pop() in outside.stderr  # the exec's run wrote it, under its lease
