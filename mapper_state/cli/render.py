"""What the operator commands print: the tables for people and the JSON documents for scripts.

Pure functions from ``ops``' results to text or to JSON-ready values; the commands
write them with :func:`mapper_state.cli.output.out`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mapper_state import jsonio
from mapper_state.ops import commands as ops
from mapper_state.ops import diff, fleet, runs
from mapper_state.ops.commands import LeaseRecord, LeaseStatus, Snapshot, format_time, iso_time
from mapper_state.redact import redact_known

# -- small words -------------------------------------------------------------------------


def dump(value: Any, pretty: bool) -> bytes:
    return jsonio.dumps(value, indent=pretty) + b"\n"


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def ago(seconds: float) -> str:
    """``58s ago`` for a time ``seconds`` in the past, ``in 58s`` for one in the future."""
    later, seconds = seconds < 0, abs(seconds)
    if seconds < 120:
        text = f"{seconds:.0f}s"
    elif seconds < 7200:
        text = f"{seconds / 60:.0f}m"
    else:
        text = f"{seconds / 3600:.1f}h"
    return f"in {text}" if later else f"{text} ago"


def since(epoch: float, now: float) -> str:
    """How far ``epoch`` is from ``now``: ``58s ago`` or ``in 58s``."""
    return ago(now - epoch)


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as aligned columns; the last column is not padded."""
    last = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(last)]
    return [
        "  ".join([*(r[i].ljust(widths[i]) for i in range(last)), r[last]]).rstrip() for r in rows
    ]


def _utc(iso_or_time: str) -> str:
    return iso_or_time.replace("T", " ").removesuffix("Z")


# -- state list --long / --stale ---------------------------------------------------------


def pipeline_doc(p: fleet.Pipeline, now: float) -> dict[str, Any]:
    lease: dict[str, Any] = {"status": p.lease_status.value}
    if p.holder is not None:
        lease.update(
            run_id=p.holder.run_id,
            host=p.holder.host,
            pid=p.holder.pid,
            since=format_time(p.holder.acquired_at),
            expires_at=format_time(p.holder.expires_at),
        )
    age = p.age(now)
    return {
        "state_id": p.state_id,
        "last_written": None if p.last_written is None else format_time(p.last_written),
        "age_seconds": None if age is None else round(age, 3),
        "writer_run_id": p.writer_run_id,
        "lease": lease,
        "snapshots": p.snapshots,
        "last_run": None if p.last_run is None else run_doc(p.last_run, p.last_outcome or ""),
    }


def _lease_text(p: fleet.Pipeline, now: float) -> str:
    if p.holder is None:
        return "-" if p.lease_status is LeaseStatus.FREE else p.lease_status.value
    who = f"{p.holder.run_id} on {p.holder.host}"
    if p.lease_status is LeaseStatus.EXPIRED:
        return f"expired ({who})"
    expires = p.holder.expires_at
    return f"{who}, expires {format_time(expires)} ({since(expires, now)})"


def fleet_table(pipelines: list[fleet.Pipeline], now: float) -> str:
    rows = [("STATE ID", "LAST WRITTEN (UTC)", "AGE", "WRITER", "SNAPSHOTS", "LAST RUN", "LEASE")]
    for p in pipelines:
        age = p.age(now)
        written = "-" if p.last_written is None else _utc(format_time(p.last_written))
        rows.append(
            (
                p.state_id,
                written,
                "unknown" if age is None else ago(age),
                p.writer_run_id or "-",
                str(p.snapshots),
                "-" if p.last_run is None else _outcome_text(p.last_run, p.last_outcome, now),
                _lease_text(p, now),
            )
        )
    return "\n".join(_columns(rows)) + "\n"


# -- runs ---------------------------------------------------------------------------------


def run_doc(r: runs.RunRecord, outcome: str) -> dict[str, Any]:
    """One run record as ``runs --format json`` and ``state list --long`` print it."""
    return {
        "run_id": r.run_id,
        "outcome": outcome,
        "exit_code": r.exit_code,
        "signal": r.signal,
        "started_at": runs.iso(r.started_at),
        "ended_at": runs.iso(r.ended_at),
        "duration_seconds": None if r.duration is None else round(r.duration, 3),
        "host": r.host,
        "pid": r.pid,
        "mode": r.mode,
        "command": redact_known(r.command),
        "records": r.records,
        "bytes": r.bytes_passed,
        "states_seen": r.states_seen,
        "states_committed": r.states_committed,
        "lease_wait_seconds": r.lease_wait_seconds,
    }


def _outcome_word(r: runs.RunRecord, outcome: str | None) -> str:
    """``failed (exit 8)``, ``signalled (SIGTERM)``, ``killed``: how the run ended."""
    outcome = outcome or r.status
    if outcome == runs.FAILED and r.exit_code is not None:
        return f"{outcome} (exit {r.exit_code})"
    if outcome == runs.SIGNALLED and r.signal:
        return f"{outcome} ({r.signal})"
    return outcome


def _outcome_text(r: runs.RunRecord, outcome: str | None, now: float) -> str:
    """``failed (exit 8) 2m ago``: how the run ended, and when (or started, if it has not)."""
    when = r.ended_at if r.ended_at is not None else r.started_at
    return f"{_outcome_word(r, outcome)} {since(when, now)}"


def runs_table(state_id: str, shown: list[tuple[runs.RunRecord, str]]) -> str:
    if not shown:
        return f"no run records of {state_id}\n"
    rows = [("STARTED (UTC)", "RUN ID", "OUTCOME", "DURATION", "RECORDS", "STATES", "HOST", "PID")]
    for r, outcome in shown:
        rows.append(
            (
                _utc(runs.iso(r.started_at) or "-"),
                r.run_id,
                _outcome_word(r, outcome),
                "-" if r.duration is None else f"{r.duration:.1f}s",
                "-" if r.records is None else str(r.records),
                f"{r.states_committed}/{r.states_seen}",
                r.host,
                str(r.pid),
            )
        )
    return "\n".join(_columns(rows)) + "\n"


# -- state history -----------------------------------------------------------------------


def history_doc(rows: list[tuple[Snapshot, str]], current: str | None) -> list[dict[str, Any]]:
    return [
        {
            "snapshot": s.name,
            "time": iso_time(s.time),
            "run_id": s.run_id,
            "host": s.host,
            "command": s.command,
            "written_by": s.written_by,
            "changes": change,
            "current": s.name == current,
            "singer_state": s.value,
        }
        for s, change in rows
    ]


def history_table(
    state_id: str, rows: list[tuple[Snapshot, str]], current: str | None, exists: bool
) -> str:
    if not exists:
        now = "it has no state now (cleared)"
    elif current is None:
        now = "its current state is not in the history"
    else:
        now = "* marks the current state"
    head = f"{state_id}: {plural(len(rows), 'snapshot')}, newest first; {now}"
    if not rows:
        return head + "\n"
    table = [("", "SNAPSHOT", "TIME (UTC)", "RUN", "HOST", "BY", "CHANGES")]
    for snap, change in rows:
        table.append(
            (
                "*" if snap.name == current else "",
                snap.name,
                snap.time.strftime("%Y-%m-%d %H:%M:%S"),
                snap.run_id,
                snap.host or "-",
                snap.written_by,
                change,
            )
        )
    return "\n".join([head, *_columns(table)]) + "\n"


# -- state diff --------------------------------------------------------------------------


def _side_doc(side: diff.Side) -> dict[str, Any]:
    return {
        "snapshot": side.label,
        "time": iso_time(side.time) if side.time else None,
        "run_id": side.run_id,
    }


def _change_doc(change: diff.Change) -> dict[str, Any]:
    return {"path": change.path, "change": change.kind, "from": change.old, "to": change.new}


def diff_doc(result: diff.StateDiff) -> dict[str, Any]:
    return {
        "state_id": result.state_id,
        "from": _side_doc(result.old),
        "to": _side_doc(result.new),
        "streams": [
            {
                "stream": s.stream,
                "change": s.kind,
                "changes": [_change_doc(c) for c in s.changes],
            }
            for s in result.streams
        ],
        "other": [_change_doc(c) for c in result.other],
        "unchanged": list(result.unchanged),
    }


def _shown(value: Any, limit: int = 80) -> str:
    text = jsonio.dumps(value).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _change_line(where: str, change: diff.Change) -> str:
    path = f"{where}.{change.path}" if change.path and where else change.path or where
    if change.kind == "added":
        return f"  {path}: added {_shown(change.new)}"
    if change.kind == "removed":
        return f"  {path}: removed (was {_shown(change.old)})"
    return f"  {path}: {_shown(change.old)} -> {_shown(change.new)}"


def _side_text(side: diff.Side) -> str:
    if side.time is None:
        return side.label
    return f"{side.label} ({side.time.strftime('%Y-%m-%d %H:%M:%S')} UTC, run {side.run_id})"


def diff_text(result: diff.StateDiff) -> str:
    lines = [f"{result.state_id}: {_side_text(result.old)} -> {_side_text(result.new)}"]
    for stream in result.streams:
        lines += [_change_line(stream.stream, c) for c in stream.changes]
    lines += [_change_line("", c) for c in result.other]
    if not result.moved:
        lines.append("  no bookmark moved")
    if result.unchanged:
        lines.append(f"  {plural(len(result.unchanged), 'stream')} unchanged")
    return "\n".join(lines) + "\n"


# -- lock status -------------------------------------------------------------------------


def holder_doc(record: LeaseRecord) -> dict[str, Any]:
    return {
        "run_id": record.run_id,
        "host": record.host,
        "pid": record.pid,
        "command": redact_known(record.command),
        "acquired_at": format_time(record.acquired_at),
        "renewed_at": format_time(record.renewed_at),
        "expires_at": format_time(record.expires_at),
        "ttl_seconds": record.ttl_seconds,
    }


def lock_status_doc(
    state_id: str,
    status: LeaseStatus,
    record: LeaseRecord | None,
    store: str = "",
    origin: str = "",
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "state_id": state_id,
        "status": status.value,
        "free": status not in (LeaseStatus.HELD, LeaseStatus.BROKEN),
        "expired": status in (LeaseStatus.EXPIRED, LeaseStatus.UNREADABLE),
        "holder": holder_doc(record) if record else None,
        "store": store,
        "store_from": origin,
    }
    if record is not None and status == "broken":
        doc["free_from"] = format_time(record.free_from())
    if record is not None and status == "held":
        doc["holder"]["running_here"] = {"alive": True, "gone": False}.get(ops.holder_here(record))
    return doc


def _lock_headline(status: LeaseStatus, record: LeaseRecord | None, now: float) -> str:
    if status is LeaseStatus.UNREADABLE:
        return "free (the lease object is unreadable, so it counts as expired)"
    if status is LeaseStatus.FREE or record is None:
        return "free (no lease)"
    if status is LeaseStatus.HELD:
        return f"held, expires {since(record.expires_at, now)}"
    if status is LeaseStatus.BROKEN:
        return (
            f"broken, its holder may still be running: free once it has stopped, at the "
            f"latest {format_time(record.free_from())} ({since(record.free_from(), now)})"
        )
    return (
        f"free: the lease expired {since(record.expires_at, now)} without being "
        "released (its holder crashed or was killed?); the next run takes it over"
    )


def lock_status_text(
    state_id: str, status: LeaseStatus, record: LeaseRecord | None, now: float, store: str = ""
) -> str:
    lines = [f"{state_id}: {_lock_headline(status, record, now)}"]
    if store:
        lines.append(f"  {'store':<9} {store}")
    if record:
        for label, value in (
            ("run id", record.run_id),
            ("host", record.host),
            ("pid", str(record.pid)),
            ("command", redact_known(record.command) or "-"),
            ("acquired", f"{format_time(record.acquired_at)} ({since(record.acquired_at, now)})"),
            ("renewed", f"{format_time(record.renewed_at)} ({since(record.renewed_at, now)})"),
            ("expires", f"{format_time(record.expires_at)} ({since(record.expires_at, now)})"),
        ):
            lines.append(f"  {label:<9} {value}")
        if status == "held" and (note := ops.not_running_note(record)):
            lines.append(f"  {'note':<9} {note}")
    return "\n".join(lines) + "\n"
