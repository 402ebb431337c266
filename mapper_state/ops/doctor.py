"""``doctor``: prove that the configured store can hold a lease safely, end to end.

Locking rests on three store promises: create-if-absent, compare-and-swap on a
version, and (less critically) delete-if-version. Some S3-compatible stores accept
the conditional headers and silently ignore them; on such a store two runs can both
hold the lease, so this must be found out and said plainly, before the first run.
All probing happens on one scratch object under a reserved name
(``.mapper-state-doctor/<random>.probe``): it cannot be a state ID's object, never
shows in ``state list``, and is removed afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from mapper_state.core.lease import releases_by_delete
from mapper_state.errors import ExitCode
from mapper_state.stores.base import (
    BlobStore,
    ConditionNotSupported,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
)

Status = Literal["ok", "warning", "unsafe", "failed", "skipped"]
SCRATCH_DIR = ".mapper-state-doctor"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str = ""


@dataclass
class Report:
    store: str
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: Status, detail: str = "") -> None:
        self.checks.append(Check(name, status, detail))

    def status_of(self, name: str) -> Status | None:
        return next((c.status for c in self.checks if c.name == name), None)

    @property
    def verdict(self) -> Literal["safe", "warning", "unsafe", "failed"]:
        statuses = {c.status for c in self.checks}
        if "unsafe" in statuses:
            return "unsafe"
        if "failed" in statuses:
            return "failed"
        return "warning" if "warning" in statuses else "safe"

    @property
    def exit_code(self) -> int:
        return {
            "unsafe": ExitCode.UNSAFE_STORE,
            "failed": ExitCode.STORE,
        }.get(self.verdict, ExitCode.OK)

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "verdict": self.verdict,
            "exit_code": int(self.exit_code),
            "checks": [asdict(c) for c in self.checks],
        }


VERDICTS = {
    "safe": "the store is safe for locking.",
    "warning": "the store is safe for locking, with the warning above.",
    "failed": "the store cannot be used as it is: fix the failures above.",
    "unsafe": (
        "UNSAFE FOR LOCKING: this store accepts conditional writes but ignores their "
        "conditions, so two runs could both hold the lease and overwrite each other's "
        "state. Do not use it with mapper-state; use a store that enforces conditional "
        "writes (run `mapper-state doctor` against it to check)."
    ),
}

_CONDITIONAL_CHECKS = (
    "create-if-absent",
    "compare-and-swap",
    "conditional delete",
    "release",
    "operator delete",
)


_ACCESS_CHECKS = ("reachable", "credentials accepted", "read", "write", "list", "delete")


class _Probe:
    """The scratch objects, and store calls on them whose failures become check results."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self.keys: list[str] = []
        self.failures: dict[str, str] = {}

    @staticmethod
    def new_key() -> str:
        return f"{SCRATCH_DIR}/{uuid.uuid4().hex}.probe"

    def attempt(self, name: str, call: Callable[[], Any]) -> tuple[bool, Any]:
        """Run ``call``; remember why ``name`` failed if it raises."""
        try:
            return True, call()
        except StoreAccessDenied as exc:
            self.failures.setdefault(name, f"permission denied: {exc.message}")
        except StoreError as exc:
            self.failures.setdefault(name, exc.message)
        return False, None

    def clean_up(self, report: Report) -> None:
        """Remove every scratch object that a create may have left behind."""
        for key in self.keys:
            try:
                self.store.delete(key)
            except StoreError as exc:
                report.add("clean-up", "warning", f"could not remove {key}: {exc.message}")


def run_checks(store: BlobStore) -> Report:
    """Probe ``store`` and report; never raises for a store failure."""
    report = Report(store.display_uri)
    probe = _Probe(store)
    try:
        _check_access(probe, report)
        if report.status_of("write") == "ok":
            _check_conditions(probe, report)
    finally:
        probe.clean_up(report)
    reason = _skip_reason(report)
    for name in _CONDITIONAL_CHECKS:
        if report.status_of(name) is None:
            report.add(name, "skipped", reason)
    return report


def _skip_reason(report: Report) -> str:
    """Why the conditional checks that have no result were not run: the check that stopped them."""
    for name, why in (
        ("reachable", "the store is unreachable"),
        ("write", "needs the write check to pass"),
        ("conditional writes", "the conditional-write probe failed"),
        ("compare-and-swap", "needs compare-and-swap to work"),
    ):
        check = next((c for c in report.checks if c.name == name), None)
        if check is not None and check.status in ("failed", "skipped"):
            return f"{why} ({check.detail})" if check.detail else why
    return "an earlier check failed"


def _check_access(probe: _Probe, report: Report) -> None:
    store, key, data = probe.store, probe.new_key(), b"mapper-state doctor probe\n"
    try:
        store.read(key)
    except StoreAccessDenied as exc:
        probe.failures["read"] = f"permission denied: {exc.message}"
    except StoreError as exc:
        report.add("reachable", "failed", exc.message)
        for name in _ACCESS_CHECKS[1:]:
            report.add(name, "skipped", "the store is unreachable")
        return
    wrote, _ = probe.attempt("write", lambda: store.create(key, data))
    if wrote or not probe.failures["write"].startswith("permission denied"):
        probe.keys.append(key)
    ok, blob = probe.attempt("read", lambda: store.read(key))
    if ok and wrote and (blob is None or blob.data != data):
        probe.failures.setdefault("read", "reading back the object gave different bytes")
    ok, keys = probe.attempt("list", lambda: list(store.list(f"{SCRATCH_DIR}/")))
    if ok and wrote and key not in keys:
        probe.failures.setdefault("list", "a listing did not show the object just written")
    if wrote:  # a plain delete: the conditional one is a check of its own
        ok, _ = probe.attempt("delete", lambda: store.delete(key))
        if ok and store.read(key) is not None:
            probe.failures.setdefault("delete", "the object was still there after a delete")
    _report_access(probe, report, wrote)


def _report_access(probe: _Probe, report: Report, wrote: bool) -> None:
    ops = ("read", "write", "list", "delete")
    tried = [n for n in ops if wrote or n != "delete"]
    refused = all(probe.failures.get(n, "").startswith("permission denied") for n in tried)
    report.add("reachable", "ok")
    report.add(
        "credentials accepted",
        "failed" if refused else "ok",
        "every operation was refused" if refused else "",
    )
    for name in ops:
        if name in probe.failures:
            report.add(name, "failed", probe.failures[name])
        elif name == "delete" and not wrote:
            report.add(name, "skipped", "needs write permission")
        else:
            report.add(name, "ok")


def _check_conditions(probe: _Probe, report: Report) -> None:
    store, key = probe.store, probe.new_key()
    probe.keys.append(key)
    try:
        first = store.create(key, b"one")
        _check_create(store, key, report)  # 1. how a lease is acquired
        blob = store.read(key)
        current = blob.version if blob else first
        # 2. renewals, takeovers and fenced state writes
        if not _check_swap(store, key, current, report):
            return
        _check_delete(store, key, current, report)  # 3. delete-if-version
        _report_deletes(store, report)
    except StoreError as exc:
        report.add("conditional writes", "failed", exc.message)


def _check_create(store: BlobStore, key: str, report: Report) -> None:
    try:
        store.create(key, b"two")
        report.add(
            "create-if-absent",
            "unsafe",
            "a create of an object that exists was accepted: two runs could both take the lease",
        )
    except PreconditionFailed:
        report.add("create-if-absent", "ok", "a create of an existing object was rejected")


def _check_swap(store: BlobStore, key: str, current: str, report: Report) -> bool:
    """Compare-and-swap with the current version, then a stale one; False if the first fails."""
    try:
        store.replace(key, b"three", if_version=current)
    except PreconditionFailed:
        report.add("compare-and-swap", "failed", "a replace with the current version was rejected")
        return False
    try:
        store.replace(key, b"four", if_version=current)
        status: Status = "unsafe"
        detail = (
            "a replace with a stale version was accepted: a run that lost its lease could "
            "still overwrite the state"
        )
    except PreconditionFailed:
        status, detail = "ok", "a replace with a stale version was rejected"
    if store.traits.learned.unquoted_etags.known:
        detail += (
            " (this endpoint matches If-Match only without the quotes S3 puts around ETags: "
            "they are sent unquoted here)"
        )
    report.add("compare-and-swap", status, detail)
    return True


def _check_delete(store: BlobStore, key: str, stale: str, report: Report) -> None:
    """A delete at a stale version: refused (good), ignored, or not supported at all."""
    try:
        store.delete(key, if_version=stale)
        ignored = True
    except PreconditionFailed:
        ignored = False
    except ConditionNotSupported as exc:
        report.add(
            "conditional delete",
            "ok",
            f"the store refuses a delete with a condition ({exc.message}), while a plain "
            "delete works; mapper-state does not rely on it here",
        )
        return
    if not ignored:
        report.add("conditional delete", "ok", "a delete with a stale version was rejected")
    elif not releases_by_delete(store):
        report.add(
            "conditional delete",
            "ok",
            "a delete with a stale version was accepted (the condition is ignored); "
            "mapper-state does not rely on it here",
        )
    else:
        detail = "a delete with a stale version was accepted"
        if report.verdict != "unsafe":
            detail += (
                ". Locking stays safe (acquiring, renewing and state writes are still "
                "conditional), but this store is taken to enforce delete conditions, so "
                "a run that lost its lease may delete its successor's lease when it "
                "exits; the successor then stops at its next renewal instead of finishing"
            )
        report.add("conditional delete", "warning", detail)


def _report_deletes(store: BlobStore, report: Report) -> None:
    """Which release, and which delete the operator commands (``state clear``/``move``) use."""
    report.add(
        "release",
        "ok",
        "by a conditional delete of the lease"
        if releases_by_delete(store)
        else "by compare-and-swap to a released lease record (safe whether or not the "
        "store checks delete conditions)",
    )
    report.add(
        "operator delete",
        "ok",
        "a plain delete under the command's lease, after checking the state's version "
        "(this store refuses conditional deletes)"
        if store.traits.learned.refuses_delete_conditions.known
        else "a delete conditional on the state's version, under the command's lease",
    )


def render_text(report: Report) -> str:
    width = max(len(c.name) for c in report.checks)
    lines = [f"mapper-state doctor: {report.store}"]
    for check in report.checks:
        mark = {"ok": "ok", "skipped": "skipped"}.get(check.status, check.status.upper())
        detail = f"  {check.detail}" if check.detail else ""
        lines.append(f"  {mark:<8} {check.name:<{width}}{detail}".rstrip())
    lines.append(f"verdict: {VERDICTS[report.verdict]}")
    return "\n".join(lines)
