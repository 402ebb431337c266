"""``state set`` and ``state merge``: a state from JSON or stdin, written under the lease."""

from __future__ import annotations

from typing import Any

import click

from mapper_state import jsonio, log
from mapper_state.cli.output import meltano_option, parse_input, read_input, stream_option
from mapper_state.cli.params import STATE_ID
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import BadInput, ExitCode
from mapper_state.ops import commands as ops
from mapper_state.ops import streams

_CODES = (ExitCode.BAD_INPUT, ExitCode.NOT_FOUND)


def _parse_bookmark(arg: str | None) -> Any:
    data, where = read_input(arg)
    try:
        return jsonio.loads(data)
    except jsonio.DecodeError as exc:
        raise BadInput(f"{where} is not valid JSON ({exc}); nothing was changed") from None


@click.command("set")
@click.argument("state_id", type=STATE_ID)
@click.argument("state_json", metavar="[JSON|-]", required=False)
@meltano_option
@stream_option
@store_command(lease=True, codes=_CODES)
def state_set(
    cx: StoreAccess, state_id: str, state_json: str | None, meltano: bool, stream: str | None
) -> None:
    """Replace the state of STATE_ID (from JSON, or stdin with - or nothing), under the lease.

    With --stream S, replace only that stream's bookmark (bookmarks.S) with JSON and
    keep the others.

    \b
    Examples:
      mapper-state state set dev:tap-x-to-target-y '{"bookmarks": {}}'
      mapper-state state set dev:tap-x-to-target-y - < state.json
      mapper-state state set dev:tap-x-to-target-y --stream users '{"id": 7}'
    """
    if stream is not None:
        if meltano:
            raise click.UsageError("--stream and --meltano do not go together")
        bookmark = _parse_bookmark(state_json)
        streams.set_stream(cx.store, state_id, stream, bookmark, cx.terms)
        log.info(f"set the bookmark of stream {stream} in {state_id}")
        return
    value = parse_input(state_json, meltano)
    ops.set_state(cx.store, state_id, value, cx.terms)
    log.info(f"set the state of {state_id}")


@click.command("merge")
@click.argument("state_id", type=STATE_ID)
@click.argument("state_json", metavar="[JSON|-]", required=False)
@meltano_option
@store_command(lease=True, codes=_CODES)
def state_merge(cx: StoreAccess, state_id: str, state_json: str | None, meltano: bool) -> None:
    """Deep-merge JSON (or stdin) over the state of STATE_ID, under the lease.

    \b
    Example:
      mapper-state state merge dev:tap-x-to-target-y '{"bookmarks": {"users": {"id": 7}}}'
    """
    value = parse_input(state_json, meltano)
    ops.merge_state(cx.store, state_id, value, cx.terms)
    log.info(f"merged into the state of {state_id}")
