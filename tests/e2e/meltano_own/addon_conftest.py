"""The fixtures that put mapper-state's add-on under Meltano's own state tests.

``tests/e2e/test_meltano_own_tests.py`` unpacks Meltano's sdist at test time and copies this
file to ``tests/meltano/conftest.py`` in it; Meltano's tests themselves run unchanged. What
changes is only what chooses the backend:

- every test's project uses ``state_backend.uri`` = the add-on's URI (``MELTANO_STATE_BACKEND_URI``),
  a fresh store for each test: a directory, or a fresh prefix in the S3 bucket;
- ``state_service``: Meltano's fixture writes the jobs of its history into the system
  database, where its ``systemdb`` backend finds them; here the same jobs are replayed, in
  the order they ended, through ``update()`` as a ``meltano run`` writes them;
- the ``subject`` of ``TestLocalFilesystemStateStoreManager`` is the add-on on that store
  (with the three path methods the tests use to plant files where the file store keeps a
  state: the layout is Meltano's, ``<root>/<state_id>/state.json``).

:data:`SKIPPED` lists the tests not run, each with why: they test Meltano's own backend
classes, methods or file paths, not the behaviour of a state backend. The outcome of
every test is appended to the file named by ``MAPPER_STATE_MELTANO_TESTS_REPORT``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

#: ``file`` or ``mapper-state+s3://bucket/prefix`` (its options in ``MAPPER_STATE_*`` variables).
STORE = os.environ.get("MAPPER_STATE_MELTANO_TESTS_STORE", "file")
REPORT = os.environ.get("MAPPER_STATE_MELTANO_TESTS_REPORT", "")

_CLASS_BOUND = "tests one of Meltano's own backend classes (its client, paths or settings), not a backend's behaviour"
_FS = "meltano/core/state_store/test_filesystem.py::TestLocalFilesystemStateStoreManager::"

#: ``node ID prefix -> reason``: the tests not run against the add-on, on every store.
SKIPPED: dict[str, str] = {
    "meltano/core/state_store/test_db.py": "tests Meltano's systemdb backend (DBStateStoreManager), not a backend's behaviour",
    "meltano/core/state_store/test_state_store.py::TestSystemDBStateBackend": _CLASS_BOUND,
    "meltano/core/state_store/test_state_store.py::TestLocalFilesystemStateBackend": _CLASS_BOUND,
    "meltano/core/state_store/test_state_store.py::TestAzureStateBackend": _CLASS_BOUND,
    "meltano/core/state_store/test_state_store.py::TestGCSStateBackend": _CLASS_BOUND,
    "meltano/core/state_store/test_state_store.py::TestS3StateBackend": _CLASS_BOUND
    + " (under moto's in-process mock)",
    "meltano/core/state_store/test_state_store.py::test_settings_to_manager_kwargs": (
        "tests how Meltano turns settings into keyword arguments for a made-up scheme"
    ),
    "meltano/core/state_store/test_state_store.py::test_unknown_state_backend_scheme": (
        "tests Meltano's lookup of an unknown scheme"
    ),
    "meltano/core/state_store/test_state_store.py::test_pluggable_state_backend": (
        "tests Meltano's entry-point lookup with its dummy backend"
    ),
    "meltano/core/state_store/test_filesystem.py::TestAZStorageStateStoreManager": _CLASS_BOUND,
    "meltano/core/state_store/test_filesystem.py::TestS3StateStoreManager": _CLASS_BOUND,
    "meltano/core/state_store/test_filesystem.py::TestGCSStateStoreManager": _CLASS_BOUND,
    _FS + "test_join_path": "Meltano's file backend's path method join_path",
    _FS + "test_create_state_id_dir_if_not_exists": "Meltano's file backend's directory method",
    _FS + "test_get_reader": "Meltano's file backend's get_reader (smart_open)",
    _FS + "test_get_writer": "Meltano's file backend's get_writer (smart_open)",
    _FS + "test_get_state_path": "Meltano's file backend's path method get_state_path",
    _FS + "test_get_lock_path": "Meltano's file backend's lock file path",
    _FS + "test_acquire_lock": "looks for Meltano's lock file; the add-on's lock is a lease record",
    _FS
    + "test_lock_timeout": "Meltano's is_locked on its lock file, its clock frozen by time_machine",
    _FS + "test_delete": "Meltano's file backend's delete_file method",
    _FS + "test_clear_all": (
        "counts the entries of the store's directory: the add-on keeps history snapshots "
        "beside the states (so `meltano state clear` can be undone)"
    ),
}

#: Tests that plant or read files where the file store keeps a state: run on the file store only.
FILE_STORE_ONLY: dict[str, str] = {
    _FS + "test_get_state_ids": "plants empty state.json files in the store's directory",
    _FS + "test_get[": "plants state.json files in the store's directory",
    _FS + "test_update[": "reads the state.json file written",
    _FS + "test_update_partial_state": "plants and reads state.json files",
    _FS + "test_clear[": "plants state.json files, then checks their directory is gone",
}


def _reason(nodeid: str) -> str | None:
    for prefix, reason in SKIPPED.items():
        if nodeid.startswith(prefix):
            return reason
    if STORE != "file":
        for prefix, reason in FILE_STORE_ONLY.items():
            if (nodeid + "[").startswith(prefix) or nodeid.startswith(prefix):
                return f"file store only: {reason}"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = _reason(item.nodeid.removeprefix("tests/"))
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"bound to Meltano's backend: {reason}"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not REPORT:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        line = {"nodeid": report.nodeid, "outcome": report.outcome, "when": report.when}
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            line["reason"] = str(report.longrepr[2])
        elif report.outcome == "failed":
            line["error"] = str(report.longrepr)[-3000:]
        with open(REPORT, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


# -- the backend -------------------------------------------------------------------------


def _fresh_uri(root: Path) -> str:
    if STORE == "file":
        return f"mapper-state+file://{root}"
    return f"{STORE}/{uuid.uuid4().hex}"


@pytest.fixture(autouse=True)
def addon_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test's project keeps its state in a fresh store through the add-on."""
    uri = _fresh_uri(tmp_path / "mapper-state-store")
    monkeypatch.setenv("MELTANO_STATE_BACKEND_URI", uri)
    return uri


@pytest.fixture
def state_service(job_history_session: Any, project: Any, jobs: list[Any]) -> Any:
    """Meltano's ``state_service``, its job history replayed into the add-on's store."""
    from meltano.core.job import Payload
    from meltano.core.state_service import StateService
    from meltano.core.state_store import MeltanoState

    from mapper_state.meltano.backend import MapperStateBackend

    service = StateService(project, session=job_history_session)
    manager = service.state_store_manager
    assert isinstance(manager, MapperStateBackend), "not the add-on"

    def replay(state_id: str) -> None:
        for job in sorted((j for j in jobs if j.job_name == state_id), key=lambda j: j.ended_at):
            complete = job.payload_flags == Payload.STATE
            manager.update(
                MeltanoState(
                    state_id=state_id,
                    completed_state=job.payload if complete else {},
                    partial_state={} if complete else job.payload,
                )
            )

    # one thread per state ID (each one's jobs in order), as runs of several pipelines would
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(replay, sorted({j.job_name for j in jobs})))
    return service


def _add_on_file_paths(cls: type) -> type:
    """The add-on, with where the file store keeps a state (as Meltano's file backend says)."""

    class OnFiles(cls):  # type: ignore[misc]
        @property
        def state_dir(self) -> str:
            return str(self.store.root)

        def get_path(self, state_id: str, filename: str | None = None) -> str:
            path = Path(self.store.root, state_id)
            return str(path / filename if filename else path)

        def get_state_path(self, state_id: str) -> str:
            return self.get_path(state_id, "state.json")

    return OnFiles


def _subject(self: object, function_scoped_test_dir: Path) -> Iterator[Any]:
    from mapper_state.meltano.backend import MapperStateBackend

    root = Path(function_scoped_test_dir, ".meltano", "state")
    if STORE == "file":
        backend = _add_on_file_paths(MapperStateBackend)(
            uri=f"mapper-state+file://{root}/", lock_timeout_seconds=10
        )
    else:
        backend = MapperStateBackend(uri=_fresh_uri(root), lock_timeout_seconds=10)
    try:
        yield backend
    finally:
        backend.close()


def _state_path(self: object, function_scoped_test_dir: Path) -> Iterator[str]:
    path = Path(function_scoped_test_dir, ".meltano", "state")
    path.mkdir(parents=True, exist_ok=True)
    yield str(path)


def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> None:
    """Give ``TestLocalFilesystemStateStoreManager`` the add-on as its ``subject``."""
    if name == "TestLocalFilesystemStateStoreManager" and isinstance(obj, type):
        obj.subject = pytest.fixture(name="subject")(_subject)  # type: ignore[attr-defined]
        obj.state_path = pytest.fixture(name="state_path")(_state_path)  # type: ignore[attr-defined]
