"""``mapper-state lock ...``: who holds a state ID's lease, and breaking it."""

from __future__ import annotations

import time

import click
import orjson

from mapper_state import log
from mapper_state.cli import render
from mapper_state.cli.output import confirm, format_option, out, yes_option
from mapper_state.cli.params import STATE_ID
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import ExitCode
from mapper_state.ops import commands as ops


@click.group("lock")
def lock_group() -> None:
    """Inspect or break the lease that keeps one run per state ID.

    \b
    Examples:
      mapper-state lock status dev:tap-x-to-target-y
      mapper-state lock break dev:tap-x-to-target-y --yes
    """


@lock_group.command("status")
@click.argument("state_id", type=STATE_ID)
@format_option
@store_command(codes=(ExitCode.DOWNSTREAM_CLOSED,))
def lock_status(cx: StoreAccess, state_id: str, output_format: str) -> None:
    """Show who holds the lease on STATE_ID, or that it is free.

    \b
    Example:
      mapper-state lock status dev:tap-x-to-target-y --format json
    """
    status, record = ops.lock_status(cx.store, state_id)
    if output_format == "json":
        out(orjson.dumps(render.lock_status_doc(state_id, status, record)) + b"\n")
        return
    out(render.lock_status_text(state_id, status, record, time.time()))


@lock_group.command("break")
@click.argument("state_id", type=STATE_ID)
@yes_option
@store_command()
def lock_break(cx: StoreAccess, state_id: str, yes: bool) -> None:
    """Forcibly free the lease on STATE_ID (asks first; --yes in scripts).

    The old holder's next state write is then refused (fencing), so it cannot
    overwrite the state of the run that takes the lease next.

    \b
    Example:
      mapper-state lock break dev:tap-x-to-target-y --yes
    """
    store = cx.store
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
    old = ops.break_lease(store, state_id)
    if old:
        log.info(
            f"broke the lease on {state_id} of run {old.run_id} on host {old.host} "
            f"(pid {old.pid}); its next state write will be refused"
        )
    else:
        log.info(f"broke the lease on {state_id}")
