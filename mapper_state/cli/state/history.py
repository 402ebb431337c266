"""``state history`` and ``state rollback``: the snapshots kept, and going back to one."""

from __future__ import annotations

import click

from mapper_state import jsonio, log
from mapper_state.cli import render
from mapper_state.cli.output import format_option, out
from mapper_state.cli.params import STATE_ID
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import ExitCode
from mapper_state.ops import commands as ops


@click.command("history")
@click.argument("state_id", type=STATE_ID)
@format_option
@store_command(codes=(ExitCode.NOT_FOUND, ExitCode.DOWNSTREAM_CLOSED))
def state_history(cx: StoreAccess, state_id: str, output_format: str) -> None:
    """List the kept snapshots of STATE_ID, newest first, with what each changed.

    \b
    Example:
      mapper-state state history dev:tap-x-to-target-y
    """
    view = ops.history_view(cx.store, state_id)
    if output_format == "json":
        out(jsonio.dumps(render.history_doc(view.rows, view.current)) + b"\n")
        return
    out(render.history_table(state_id, view.rows, view.current, view.exists))


@click.command("rollback")
@click.argument("state_id", type=STATE_ID)
@click.option(
    "--to", "ref", required=True, metavar="SNAPSHOT", help="A snapshot name (or its start)."
)
@store_command(lease=True, codes=(ExitCode.NOT_FOUND, ExitCode.BAD_INPUT))
def state_rollback(cx: StoreAccess, state_id: str, ref: str) -> None:
    """Restore STATE_ID to a snapshot from `state history`, under the lease.

    A SNAPSHOT start that matches several snapshots is refused (exit 6).

    \b
    Example:
      mapper-state state rollback dev:tap-x-to-target-y --to 2024-06-01T10
    """
    snap, changed = ops.rollback(cx.store, state_id, ref, cx.terms)
    if changed:
        log.info(f"rolled {state_id} back to snapshot {snap.name} (run {snap.run_id})")
    else:
        log.info(f"{state_id} is already at snapshot {snap.name}; nothing changed")
