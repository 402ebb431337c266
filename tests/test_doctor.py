"""`mapper-state doctor`: an honest store passes; one that ignores conditions is called unsafe."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from mapper_state.cli import main
from mapper_state.errors import ExitCode
from mapper_state.ops import commands as ops
from mapper_state.ops.doctor import render_text, run_checks
from mapper_state.stores import open_store
from mapper_state.stores.base import Blob, StoreAccessDenied, StoreError
from mapper_state.stores.file import FileStore
from mapper_state.stores.memory import MemoryStore
from tests.support.cli import invoke

ENV = {k: v for k, v in os.environ.items() if not k.startswith(("MAPPER_STATE_", "MELTANO_"))}
CHECKS = [
    "reachable",
    "credentials accepted",
    "read",
    "write",
    "list",
    "delete",
    "create-if-absent",
    "compare-and-swap",
    "conditional delete",
    "release",
    "operator delete",
]


def doctor(*args: str) -> subprocess.CompletedProcess[bytes]:
    return invoke("doctor", *args, env=ENV)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_file_store_is_safe_and_left_as_found(tmp_path: Path) -> None:
    terms = ops.WriteTerms(ttl=30, retry=1, wait=0, history_keep=20)
    ops.set_state(FileStore(tmp_path), "dev:tap-a-to-target-b", {"bookmarks": {}}, terms)
    before = {p: (tmp_path / p).read_bytes() for p in files_under(tmp_path)}

    result = doctor("--state-backend-uri", f"file://{tmp_path}")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0] == f"mapper-state doctor: file://{tmp_path}"
    assert [line.split()[0] for line in lines[1:-1]] == ["ok"] * len(CHECKS)
    assert lines[-1] == "verdict: the store is safe for locking."
    assert {p: (tmp_path / p).read_bytes() for p in files_under(tmp_path)} == before
    assert not (tmp_path / ".mapper-state-doctor").exists()

    as_json = json.loads(
        doctor("--state-backend-uri", f"file://{tmp_path}", "--format", "json").stdout
    )
    assert as_json["verdict"] == "safe"
    assert as_json["exit_code"] == 0
    assert [(c["name"], c["status"]) for c in as_json["checks"]] == [(n, "ok") for n in CHECKS]


def test_unknown_store_scheme_is_a_config_error() -> None:
    result = doctor("--state-backend-uri", "ftp://host/x")
    assert result.returncode == 2
    assert result.stderr.decode().count("\n") == 1
    assert b"unknown scheme" in result.stderr


def test_store_that_ignores_conditions_is_unsafe_for_locking() -> None:
    uri = f"memory://{uuid.uuid4().hex}?ignore_conditions=true"
    result = CliRunner().invoke(main, ["doctor", "--state-backend-uri", uri])
    assert result.exit_code == ExitCode.UNSAFE_STORE
    out = result.stdout
    assert "UNSAFE   create-if-absent" in out
    assert "two runs could both take the lease" in out
    assert "UNSAFE   compare-and-swap" in out
    assert "verdict: UNSAFE FOR LOCKING" in out
    assert list(open_store(uri).list()) == []  # cleaned up even so

    as_json = CliRunner().invoke(main, ["doctor", "--state-backend-uri", uri, "--format", "json"])
    assert as_json.exit_code == ExitCode.UNSAFE_STORE
    assert json.loads(as_json.stdout)["verdict"] == "unsafe"


class IgnoresDeleteConditions(MemoryStore):
    """Like a server that enforces If-None-Match and If-Match on writes but not on deletes."""

    def delete(self, key: str, if_version: str | None = None) -> None:
        super().delete(key)


def test_ignored_delete_condition_is_only_a_warning() -> None:
    report = run_checks(IgnoresDeleteConditions("gcs-like"))
    statuses = {c.name: c.status for c in report.checks}
    assert statuses.pop("conditional delete") == "warning"
    assert set(statuses.values()) == {"ok"}
    assert report.verdict == "warning"
    assert report.exit_code == 0
    text = render_text(report)
    assert "Locking stays safe" in text
    assert "successor" in text
    assert "verdict: the store is safe for locking, with the warning above." in text


class Refusing(MemoryStore):
    """Every call fails with ``error``, except those named in ``allowed``."""

    def __init__(self, error: StoreError, allowed: tuple[str, ...] = ()) -> None:
        super().__init__("refusing")
        self.error = error
        self.allowed = allowed

    def _check(self, name: str) -> None:
        if name not in self.allowed:
            raise self.error

    def read(self, key: str) -> Blob | None:
        self._check("read")
        return super().read(key)

    def create(self, key: str, data: bytes) -> str:
        self._check("create")
        return super().create(key, data)

    def replace(self, key: str, data: bytes, if_version: str) -> str:
        self._check("replace")
        return super().replace(key, data, if_version)

    def delete(self, key: str, if_version: str | None = None) -> None:
        self._check("delete")
        super().delete(key, if_version)

    def list(self, prefix: str = "") -> Iterator[str]:
        self._check("list")
        return super().list(prefix)


def test_unreachable_store() -> None:
    report = run_checks(Refusing(StoreError("cannot reach s3.example: connection refused")))
    statuses = {c.name: c.status for c in report.checks}
    assert statuses.pop("reachable") == "failed"
    assert set(statuses.values()) == {"skipped"}
    assert report.exit_code == ExitCode.STORE
    assert "connection refused" in render_text(report)


def test_refused_credentials() -> None:
    report = run_checks(Refusing(StoreAccessDenied("403 InvalidAccessKeyId")))
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["reachable"] == "ok"
    assert statuses["credentials accepted"] == "failed"
    assert statuses["read"] == statuses["write"] == statuses["list"] == "failed"
    assert report.exit_code == ExitCode.STORE
    assert "permission denied: 403 InvalidAccessKeyId" in render_text(report)


def test_read_only_credentials() -> None:
    store = Refusing(StoreAccessDenied("403 AccessDenied"), allowed=("read", "list"))
    report = run_checks(store)
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["credentials accepted"] == "ok"
    assert (statuses["read"], statuses["list"], statuses["write"]) == ("ok", "ok", "failed")
    assert statuses["delete"] == "skipped"
    assert statuses["create-if-absent"] == statuses["compare-and-swap"] == "skipped"
    assert report.verdict == "failed"
    assert report.exit_code == ExitCode.STORE
    assert "fix the failures above" in render_text(report)


@pytest.mark.cloud
@pytest.mark.parametrize(
    ("location", "verdict", "code"),
    [
        ("s3_location", "safe", 0),  # moto enforces If-None-Match / If-Match
        ("azure_location", "safe", 0),  # Azurite enforces ETag conditions
        # fake-gcs-server ignores delete preconditions only, and mapper-state releases
        # by compare-and-swap there
        ("gcs_location", "safe", 0),
        ("gcs_unsafe_location", "unsafe", ExitCode.UNSAFE_STORE),  # ignores every precondition
    ],
)
def test_doctor_on_real_servers(
    location: str, verdict: str, code: int, request: pytest.FixtureRequest
) -> None:
    where = request.getfixturevalue(location)
    result = invoke("doctor", "--format", "json", env={**ENV, **where.env})
    assert result.returncode == code, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == verdict, [c for c in report["checks"] if c["status"] != "ok"]
    checks = {c["name"]: c for c in report["checks"]}
    if location == "gcs_location":  # what it found, and how it releases there
        assert "condition is ignored" in checks["conditional delete"]["detail"]
        assert "compare-and-swap to a released lease record" in checks["release"]["detail"]
    assert report["store"] == where.uri
    assert list(where.open().list()) == []  # nothing left behind
