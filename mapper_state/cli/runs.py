"""``mapper-state runs ID``: the runs a state ID's records keep, newest first."""

from __future__ import annotations

import click

from mapper_state import jsonio
from mapper_state.cli import render
from mapper_state.cli.output import format_option, out
from mapper_state.cli.params import STATE_ID
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import ExitCode
from mapper_state.ops import runs


@click.command("runs")
@click.argument("state_id", type=STATE_ID)
@format_option
@store_command(codes=(ExitCode.DOWNSTREAM_CLOSED,))
def runs_command(cx: StoreAccess, state_id: str, output_format: str) -> None:
    """List the recorded runs of STATE_ID, newest first, and how each ended.

    Each run that held the lease (the filter, run, exec) leaves a record: run ID,
    host, pid, command (secrets hidden), start and end, records and bytes passed,
    states seen and committed, time waited for the lease. OUTCOME is succeeded,
    failed (with its exit code), signalled, lease-lost, busy (refused after waiting
    for the lease), killed (its lease expired with no end recorded) or running.
    The runs_keep setting says how many are kept.

    \b
    Example:
      mapper-state runs dev:tap-x-to-target-y --format json
    """
    shown = [(r.record, r.outcome) for r in runs.run_history(cx.store, state_id)]
    if output_format == "json":
        out(jsonio.dumps([render.run_doc(r, outcome) for r, outcome in shown]) + b"\n")
        return
    out(render.runs_table(state_id, shown))
