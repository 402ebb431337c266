"""A store that enforces conditional PUTs but answers 501 to a conditional delete.

The fault proxy answers 501 NotImplemented to every DeleteObject carrying ``If-Match``
in front of moto (some S3 servers do exactly that). The lease never needs that
condition there; the operator commands, which delete a state under its lease, delete
without it after checking the version; ``doctor`` says so and calls the store usable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import cli
from tests.e2e.test_meltano_backend import (  # noqa: F401 - the fixture used by name
    Backend,
    meltano_addon,
    project_for,
    singer,
)
from tests.servers import StoreLocation

pytestmark = pytest.mark.cloud

REFUSE_CONDITIONAL_DELETES = {
    "error": 1.0,
    "error_statuses": [501],
    "methods": ["DELETE"],
    "headers": ["If-Match"],
}


@pytest.fixture
def refusing(s3_location: StoreLocation, start_proxy: Any) -> tuple[Any, StoreLocation]:
    proxy, faulty = start_proxy(s3_location, faults=REFUSE_CONDITIONAL_DELETES)
    return proxy, faulty


def test_state_clear_and_move_work_where_conditional_deletes_are_refused(
    s3_location: StoreLocation, refusing: tuple[Any, StoreLocation]
) -> None:
    proxy, faulty = refusing
    direct = s3_location.open()
    for state_id in ("clear-me", "move-me"):
        proc = cli.run(faulty, "state", "set", state_id, json.dumps({"id": state_id}))
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    proc = cli.run(faulty, "state", "clear", "clear-me")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert cli.stored(direct, "clear-me") is None
    proc = cli.run(faulty, "state", "move", "move-me", "moved")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert cli.stored(direct, "move-me") is None
    assert cli.stored(direct, "moved") == {"id": "move-me"}
    assert proxy.count("DELETE", fault="error") >= 2, "no conditional delete was refused"
    assert cli.lease_is_free(s3_location, "moved")
    assert cli.lease_is_free(s3_location, "move-me")


@pytest.mark.e2e
def test_meltano_state_clear_through_the_add_on_works_where_conditional_deletes_are_refused(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    s3_location: StoreLocation,
    refusing: tuple[Any, StoreLocation],
) -> None:
    """The add-on's delete goes through the commit path, whose delete falls back to a plain
    one under the lease after checking the version, as ``mapper-state state clear`` does."""
    proxy, faulty = refusing
    env = {k: v for k, v in faulty.env.items() if k != "MAPPER_STATE_STATE_BACKEND__URI"}
    backend = Backend("s3", faulty.uri, env, faulty.open)
    project = project_for(tmp_path / "project", meltano_addon, backend)
    project.ok("set", "--force", "dev:a", singer({"bookmarks": {"s": {"id": 1}}}))
    project.ok("clear", "--force", "dev:a")
    assert cli.stored(s3_location.open(), "dev:a") is None
    assert proxy.count("DELETE", fault="error") >= 1, "no conditional delete was refused"
    assert cli.lease_is_free(s3_location, "dev:a")


def test_doctor_tells_a_refused_conditional_delete_from_a_failed_delete(
    refusing: tuple[Any, StoreLocation],
) -> None:
    _, faulty = refusing
    proc = cli.run(faulty, "doctor", "--format", "json")
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert proc.returncode == 0, proc.stdout.decode()
    assert report["verdict"] == "safe", report
    assert checks["delete"]["status"] == "ok"
    assert checks["conditional delete"]["status"] == "ok"
    assert "refuses a delete with a condition" in checks["conditional delete"]["detail"]
    assert "NotImplemented" in checks["conditional delete"]["detail"]
    assert "compare-and-swap" in checks["release"]["detail"]
    assert "plain delete under the command's lease" in checks["operator delete"]["detail"]
    assert not [c for c in report["checks"] if c["status"] == "skipped"], report


def test_doctor_names_the_check_that_stopped_the_others(
    s3_location: StoreLocation, start_proxy: Any
) -> None:
    """Writes refused with 403: the conditional checks say they need the write check."""
    _, faulty = start_proxy(s3_location, faults={"error": 1.0, "error_statuses": [403]})
    proc = cli.run(faulty, "doctor", "--format", "json")
    report = json.loads(proc.stdout)
    skipped = [c for c in report["checks"] if c["name"] == "compare-and-swap"]
    assert skipped, report
    assert skipped[0]["status"] == "skipped", report
    assert "reachable and writable" not in skipped[0]["detail"], skipped
    assert skipped[0]["detail"].startswith(("the store is unreachable", "needs the write")), skipped
