"""``state clear``: remove a state, some of its streams' bookmarks, or every state."""

from __future__ import annotations

import click

from mapper_state import log
from mapper_state.cli.output import confirm, yes_option
from mapper_state.cli.params import STATE_ID
from mapper_state.cli.render import plural
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import ExitCode
from mapper_state.ops import commands as ops
from mapper_state.ops import streams


@click.command("clear")
@click.argument("state_id", type=STATE_ID, required=False)
@click.option("--all", "clear_all", is_flag=True, help="Clear every state (asks first).")
@click.option("--pattern", metavar="GLOB", help="With --all: only state IDs matching GLOB.")
@click.option(
    "--history",
    "with_history",
    is_flag=True,
    help="Remove the history snapshots too (cannot be undone; asks first).",
)
@click.option(
    "--stream",
    "stream_names",
    multiple=True,
    metavar="STREAM",
    help="Remove only the bookmark of STREAM, keep the others (repeatable).",
)
@yes_option
@store_command(lease=True, codes=(ExitCode.NOT_FOUND,))
def state_clear(
    cx: StoreAccess,
    state_id: str | None,
    clear_all: bool,
    pattern: str | None,
    with_history: bool,
    stream_names: tuple[str, ...],
    yes: bool,
) -> None:
    """Remove the state of STATE_ID (or --all), under the lease.

    The history is kept, so `state rollback` can restore a cleared state;
    --history removes it too. --stream S removes only that stream's bookmark,
    so the next run extracts S from the start and resumes the others.

    \b
    Examples:
      mapper-state state clear dev:tap-x-to-target-y
      mapper-state state clear dev:tap-x-to-target-y --stream users
      mapper-state state clear --all --pattern 'test:*' --yes
    """
    if bool(state_id) == clear_all:
        raise click.UsageError("give a state ID or --all (not both)")
    if pattern and not clear_all:
        raise click.UsageError("--pattern goes with --all")
    if stream_names and (clear_all or with_history):
        raise click.UsageError("--stream goes with one state ID, without --all or --history")
    if state_id and stream_names:
        _clear_streams(cx, state_id, list(dict.fromkeys(stream_names)))
    elif state_id:
        _clear_one(cx, state_id, with_history, yes)
    else:
        _clear_all(cx, pattern, with_history, yes)


def _undo(cx: StoreAccess, with_history: bool) -> str:
    if with_history or cx.terms.history_keep == 0:
        return "this cannot be undone"
    return "`state rollback` can restore it from the history"


def _clear_streams(cx: StoreAccess, state_id: str, names: list[str]) -> None:
    undo = streams.clear_streams(cx.store, state_id, names, cx.terms)
    how = f"; `mapper-state state rollback {state_id} --to {undo}` undoes it" if undo else ""
    log.info(f"cleared the bookmark of {', '.join(names)} in {state_id}{how}")


def _clear_one(cx: StoreAccess, state_id: str, with_history: bool, yes: bool) -> None:
    undo = _undo(cx, with_history)
    if with_history:
        confirm(f"Clear {state_id} and its history in {cx.store.display_uri}? ({undo})", yes)
    newest = ops.clear_state(cx.store, state_id, cx.terms, with_history=with_history)
    if newest:
        undo = f"`mapper-state state rollback {state_id} --to {newest}` restores it"
    log.info(f"cleared the state of {state_id}; {undo}")


def _clear_all(cx: StoreAccess, pattern: str | None, with_history: bool, yes: bool) -> None:
    store = cx.store
    ids = ops.list_state_ids(store, pattern)
    if not ids:
        log.info(f"no states to clear in {store.display_uri}")
        return
    undo = _undo(cx, with_history)
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    what = plural(len(ids), "state") + (" and their history" if with_history else "")
    confirm(f"Clear {what} in {store.display_uri} ({shown})? ({undo})", yes)
    ops.clear_many(store, ids, cx.terms, with_history=with_history)
    log.info(f"cleared {plural(len(ids), 'state')}; {undo}")
