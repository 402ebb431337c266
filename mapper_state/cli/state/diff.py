"""``state diff``: which bookmark moved from what to what, stream by stream."""

from __future__ import annotations

import click

from mapper_state import jsonio
from mapper_state.cli import render
from mapper_state.cli.output import format_option, out
from mapper_state.cli.params import STATE_ID
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import ExitCode
from mapper_state.ops import diff


@click.command("diff")
@click.argument("state_id", type=STATE_ID)
@click.argument("refs", metavar="[SNAPSHOT [SNAPSHOT]]", nargs=-1)
@format_option
@store_command(codes=(ExitCode.NOT_FOUND, ExitCode.BAD_INPUT, ExitCode.DOWNSTREAM_CLOSED))
def state_diff(cx: StoreAccess, state_id: str, refs: tuple[str, ...], output_format: str) -> None:
    """Show which bookmark moved from what to what, stream by stream.

    With no SNAPSHOT, between the two newest snapshots (what the last run changed);
    with one, from it to the current state; with two, from the first to the second.
    A snapshot is a name from `state history` (or its unique start), or `current`.

    \b
    Examples:
      mapper-state state diff dev:tap-x-to-target-y
      mapper-state state diff dev:tap-x-to-target-y 2024-06-01T10 current
    """
    result = diff.diff(cx.store, state_id, refs)
    if output_format == "json":
        out(jsonio.dumps(render.diff_doc(result)) + b"\n")
    else:
        out(render.diff_text(result))
