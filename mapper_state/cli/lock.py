"""``mapper-state lock ...`` and ``doctor``: the lease and the store itself (SPEC 1.3)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click
import orjson

from mapper_state import log
from mapper_state.cli.common import handle_errors, store_options
from mapper_state.cli.output import (
    ago,
    confirm,
    format_option,
    open_store,
    out,
    yes_option,
)
from mapper_state.core.lease import LeaseRecord, break_lease, format_time
from mapper_state.ops import commands as ops
from mapper_state.redact import redact_known

# -- lock ----------------------------------------------------------------------------


@click.group("lock")
def lock_group() -> None:
    """Inspect or break the lease that keeps one run per state ID."""


def _holder_dict(record: LeaseRecord) -> dict[str, Any]:
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


@lock_group.command("status")
@click.argument("state_id")
@format_option
@store_options
@click.pass_context
@handle_errors
def lock_status(ctx: click.Context, /, state_id: str, output_format: str, **kw: Any) -> None:
    """Show who holds the lease on STATE_ID, or that it is free."""
    state_id = ops.check_state_id(state_id)
    _, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    status, record = ops.lock_status(store, state_id)
    if output_format == "json":
        doc = {
            "state_id": state_id,
            "status": status,
            "free": status != "held",
            "expired": status in ("expired", "unreadable"),
            "holder": _holder_dict(record) if record else None,
        }
        out(orjson.dumps(doc) + b"\n")
        return
    now = time.time()
    headline = {
        "free": "free (no lease)",
        "unreadable": "free (the lease object is unreadable, so it counts as expired)",
        "held": f"held, expires {ago(now - record.expires_at)}" if record else "",
        "expired": (
            f"free: the lease expired {ago(now - record.expires_at)} without being "
            "released (its holder crashed or was killed?); the next run takes it over"
            if record
            else ""
        ),
    }[status]
    lines = [f"{state_id}: {headline}"]
    if record:
        for label, value in (
            ("run id", record.run_id),
            ("host", record.host),
            ("pid", str(record.pid)),
            ("command", redact_known(record.command) or "-"),
            ("acquired", f"{format_time(record.acquired_at)} ({ago(now - record.acquired_at)})"),
            ("renewed", f"{format_time(record.renewed_at)} ({ago(now - record.renewed_at)})"),
            ("expires", f"{format_time(record.expires_at)} ({ago(now - record.expires_at)})"),
        ):
            lines.append(f"  {label:<9} {value}")
    out("\n".join(lines) + "\n")


@lock_group.command("break")
@click.argument("state_id")
@yes_option
@store_options
@click.pass_context
@handle_errors
def lock_break(ctx: click.Context, /, state_id: str, yes: bool, **kw: Any) -> None:
    """Forcibly free the lease on STATE_ID (asks first; --yes in scripts).

    The old holder's next state write is then refused (fencing), so it cannot
    overwrite the state of the run that takes the lease next.
    """
    state_id = ops.check_state_id(state_id)
    _, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    status, record = ops.lock_status(store, state_id)
    if status == "free":
        log.info(f"{state_id} has no lease; nothing to break")
        return
    who = record.describe() if record else "an unreadable lease"
    warning = (
        " It is still being renewed: another run may start while this one is still "
        "working, and this one's next state write will be refused."
        if status == "held"
        else ""
    )
    confirm(f"Break the lease on {state_id}, {who}?{warning}", yes)
    old = break_lease(store, state_id)
    if old:
        log.info(
            f"broke the lease on {state_id} of run {old.run_id} on host {old.host} "
            f"(pid {old.pid}); its next state write will be refused"
        )
    else:
        log.info(f"broke the lease on {state_id}")


# -- doctor --------------------------------------------------------------------------


@click.command("doctor")
@format_option
@store_options
@click.pass_context
@handle_errors
def doctor_command(ctx: click.Context, /, output_format: str, **kw: Any) -> None:
    """Check the configured store end to end, and that it is safe for locking.

    Exit codes: 0 safe (perhaps with a warning), 5 store failure, 11 unsafe for locking.
    """
    from mapper_state.ops.doctor import render_text, run_checks

    settings, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    report = run_checks(store)
    if output_format == "json":
        out(settings.redact(orjson.dumps(report.to_dict()).decode()) + "\n")
    else:
        out(settings.redact(render_text(report)) + "\n")
    if report.exit_code:
        sys.exit(report.exit_code)


COMMANDS: tuple[click.Command, ...] = (lock_group, doctor_command)
