"""``state export`` and ``state import``: every state as JSON lines, and back."""

from __future__ import annotations

import sys

import click

from mapper_state import jsonio, log
from mapper_state.cli.output import out
from mapper_state.cli.params import STATE_ID
from mapper_state.cli.render import plural
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import BadInput, ExitCode
from mapper_state.ops import commands as ops


@click.command("export")
@click.option("--pattern", metavar="GLOB", help="Only state IDs matching GLOB.")
@click.option(
    "--meltano", is_flag=True, help="One object in `meltano state export`'s format instead."
)
@store_command(codes=(ExitCode.DOWNSTREAM_CLOSED,))
def state_export(cx: StoreAccess, pattern: str | None, meltano: bool) -> None:
    """Print every state as JSON lines: {"state_id": ..., "singer_state": ...}.

    `state import` reads them back, into this store or another one; --meltano
    prints what `meltano state import` reads instead.

    \b
    Examples:
      mapper-state state export > backup.jsonl
      mapper-state state export --meltano | meltano state import
    """
    store = cx.store
    count = 0
    if meltano:
        doc = ops.export_meltano(store, pattern)
        count = len(doc)
        out(jsonio.dumps(doc) + b"\n")
    else:
        for state_id, value in ops.export_states(store, pattern):
            out(ops.export_line(state_id, value))
            count += 1
    log.info(f"exported {plural(count, 'state')} from {store.display_uri}")


@click.command("import")
@click.argument("source", metavar="[FILE|-]", default="-")
@click.option(
    "--state-id",
    type=STATE_ID,
    help="The state ID for input without one (what `meltano state get ID` prints).",
)
@click.option("--force", is_flag=True, help="Replace states that exist already.")
@store_command(lease=True, codes=(ExitCode.BAD_INPUT,))
def state_import(cx: StoreAccess, source: str, state_id: str | None, force: bool) -> None:
    """Write the states in FILE (or stdin): `state export` lines, or Meltano's output.

    Everything is checked before anything is written (a bad line is reported by
    its number and nothing is imported, exit 6); existing states are only replaced
    with --force. Each line is {"state_id": ..., "singer_state": {...}}; a line
    without state_id takes --state-id.

    \b
    Back up and restore:
      mapper-state state export > backup.jsonl
      mapper-state state import backup.jsonl --force
    Move every state to another store:
      mapper-state state export --state-backend-uri file://.mapper-state |
        mapper-state state import --state-backend-uri s3://bucket/prefix
    From Meltano (its system database or any of its backends):
      meltano state get dev:tap-x-to-target-y |
        mapper-state state import --state-id dev:tap-x-to-target-y
      meltano state export | mapper-state state import
    """
    try:
        data = sys.stdin.buffer.read() if source == "-" else open(source, "rb").read()  # noqa: SIM115
    except OSError as exc:
        raise BadInput(f"cannot read {source}: {exc.strerror}") from None
    entries = ops.parse_import(data, state_id=state_id)
    store = cx.store
    if not entries:
        log.info("nothing to import")
        return
    ops.import_states(store, entries, cx.terms, force=force)
    log.info(f"imported {plural(len(entries), 'state')} into {store.display_uri}")
