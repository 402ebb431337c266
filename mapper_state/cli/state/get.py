"""``state get``: print a state, as a tap's ``--state`` takes it."""

from __future__ import annotations

import click

from mapper_state.cli.output import format_option, meltano_option, out, stream_option
from mapper_state.cli.params import STATE_ID
from mapper_state.cli.render import dump
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import ExitCode
from mapper_state.ops import commands as ops
from mapper_state.ops import streams


@click.command("get")
@click.argument("state_id", type=STATE_ID)
@stream_option
@meltano_option
@format_option
@store_command(codes=(ExitCode.NOT_FOUND, ExitCode.DOWNSTREAM_CLOSED))
def state_get(
    cx: StoreAccess, state_id: str, stream: str | None, meltano: bool, output_format: str
) -> None:
    """Print the Singer state of STATE_ID, as a tap's --state accepts it.

    `tap --state <(mapper-state state get ID)` hands it to a tap; `state set`
    accepts exactly what this prints. --format json prints it on one line.
    --stream S prints only that stream's bookmark (what `state set --stream S` takes).

    \b
    Examples:
      mapper-state state get dev:tap-x-to-target-y > state.json
      mapper-state state get dev:tap-x-to-target-y --stream public-users
      tap-x --config tap.json --state <(mapper-state state get dev:tap-x-to-target-y)
    """
    if stream is not None and meltano:
        raise click.UsageError("--stream and --meltano do not go together")
    pretty = output_format == "text"
    if stream is not None:
        out(dump(streams.get_stream(cx.store, state_id, stream), pretty))
        return
    value = ops.get_state(cx.store, state_id)
    out(dump({"singer_state": value} if meltano else value, pretty))
