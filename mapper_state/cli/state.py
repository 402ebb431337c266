"""``mapper-state state ...``: read, change, back up and restore states (SPEC 1.3)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from mapper_state import jsonio, log
from mapper_state.cli.common import handle_errors, store_options
from mapper_state.cli.output import (
    ago,
    confirm,
    dump,
    format_option,
    meltano_option,
    open_store,
    out,
    parse_input,
    plural,
    read_input,
    yes_option,
)
from mapper_state.core import history, state
from mapper_state.core.lease import format_time
from mapper_state.errors import BadInput, ExitCode
from mapper_state.ops import commands as ops
from mapper_state.ops import diff, fleet, streams, summary

# -- state ---------------------------------------------------------------------------


@click.group("state")
def state_group() -> None:
    """Read, change, back up and restore the states in the store.

    Every write takes the state ID's lease, like a run, so it never interleaves
    with a running pipeline (a busy lease fails with exit code 3). Every write
    also keeps a snapshot in the state's history: `state history ID` lists
    them and `state rollback ID --to SNAPSHOT` undoes a bad run or a mistake,
    even after `state clear` (history is only removed by `clear --history`).
    """


@state_group.command("list")
@click.option("--pattern", metavar="GLOB", help="Only state IDs matching GLOB (* ? [...]).")
@click.option(
    "--long",
    "long_format",
    is_flag=True,
    help="Last written (time, age), writer's run ID, lease holder, snapshots kept.",
)
@click.option(
    "--stale",
    metavar="DURATION",
    help="Only states that have not moved for DURATION (90s, 15m, 36h, 2d, 1w); "
    "exit 12 when there are any.",
)
@format_option
@store_options
@click.pass_context
@handle_errors
def state_list(
    ctx: click.Context,
    /,
    pattern: str | None,
    long_format: bool,
    stale: str | None,
    output_format: str,
    **kw: Any,
) -> None:
    """List the state IDs in the store.

    --long shows, for each, when it was last written and how long ago, the run
    that wrote it, who holds its lease and until when, and the snapshots kept.
    --stale DURATION shows the same for the pipelines whose state has not moved
    for that long, and exits 12 when there are any (for a cron check or an alert).
    """
    if stale is not None or long_format:
        _fleet(ctx, pattern, stale, output_format, kw)
        return
    _, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    ids = ops.list_state_ids(store, pattern)
    if output_format == "json":
        out(jsonio.dumps(ids) + b"\n")
    elif ids:
        out("".join(f"{i}\n" for i in ids))
    else:
        log.info(f"no states{' match ' + pattern if pattern else ''} in {store.display_uri}")


def _fleet(
    ctx: click.Context,
    /,
    pattern: str | None,
    stale: str | None,
    output_format: str,
    kw: dict[str, Any],
) -> None:
    limit = fleet.parse_duration(stale) if stale is not None else None
    _, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    now = time.time()
    pipelines = fleet.survey(store, pattern)
    shown = pipelines if limit is None else fleet.stale(pipelines, limit, now)
    shown = fleet.details(store, shown)
    if output_format == "json":
        out(jsonio.dumps([_pipeline_doc(p, now) for p in shown]) + b"\n")
    elif shown:
        out(_fleet_table(shown, now))
    if limit is None:
        if not pipelines:
            log.info(f"no states{' match ' + pattern if pattern else ''} in {store.display_uri}")
        return
    if shown:
        log.warning(
            f"{len(shown)} of {plural(len(pipelines), 'state')} in {store.display_uri} "
            f"have not moved for {stale}"
        )
        sys.exit(ExitCode.STALE)
    log.info(f"every one of {plural(len(pipelines), 'state')} moved within {stale}")


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else format_time(epoch)


def _pipeline_doc(p: fleet.Pipeline, now: float) -> dict[str, Any]:
    lease: dict[str, Any] = {"status": p.lease_status}
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
        "last_written": _iso(p.last_written),
        "age_seconds": None if age is None else round(age, 3),
        "writer_run_id": p.writer_run_id,
        "lease": lease,
        "snapshots": p.snapshots,
    }


def _lease_text(p: fleet.Pipeline, now: float) -> str:
    if p.holder is None:
        return "-" if p.lease_status == "free" else p.lease_status
    who = f"{p.holder.run_id} on {p.holder.host}"
    if p.lease_status == "expired":
        return f"expired ({who})"
    return f"{who}, expires {format_time(p.holder.expires_at)} ({ago(p.holder.expires_at - now)})"


def _fleet_table(pipelines: list[fleet.Pipeline], now: float) -> str:
    rows = [("STATE ID", "LAST WRITTEN (UTC)", "AGE", "WRITER", "SNAPSHOTS", "LEASE")]
    for p in pipelines:
        age = p.age(now)
        rows.append(
            (
                p.state_id,
                "-"
                if p.last_written is None
                else format_time(p.last_written).replace("T", " ")[:-1],
                "unknown" if age is None else ago(age),
                p.writer_run_id or "-",
                str(p.snapshots),
                _lease_text(p, now),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join([*(r[i].ljust(widths[i]) for i in range(len(widths))), r[-1]]).rstrip()
        for r in rows
    ]
    return "\n".join(lines) + "\n"


stream_option = click.option(
    "--stream",
    "stream",
    metavar="STREAM",
    help="Only the bookmark of STREAM (bookmarks.STREAM).",
)


@state_group.command("get")
@click.argument("state_id")
@stream_option
@meltano_option
@format_option
@store_options
@click.pass_context
@handle_errors
def state_get(
    ctx: click.Context,
    /,
    state_id: str,
    stream: str | None,
    meltano: bool,
    output_format: str,
    **kw: Any,
) -> None:
    """Print the Singer state of STATE_ID, as a tap's --state accepts it.

    `tap --state <(mapper-state state get ID)` hands it to a tap; `state set`
    accepts exactly what this prints. --format json prints it on one line.
    --stream S prints only that stream's bookmark (what `state set --stream S` takes).
    """
    state_id = ops.check_state_id(state_id)
    if stream is not None and meltano:
        raise click.UsageError("--stream and --meltano do not go together")
    _, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    if stream is not None:
        out(dump(streams.get_stream(store, state_id, stream), output_format == "text"))
        return
    value = ops.get_state(store, state_id)
    out(dump({"singer_state": value} if meltano else value, output_format == "text"))


def _write_command(
    name: str, doc: str, write: ops.Writer, done: str, *, one_stream: bool = False
) -> click.Command:
    """``state set`` and ``state merge``: a state from JSON or stdin, written under the lease."""

    @click.argument("state_id")
    @click.argument("state_json", metavar="[JSON|-]", required=False)
    @meltano_option
    @store_options
    @click.pass_context
    @handle_errors
    def command(
        ctx: click.Context,
        /,
        state_id: str,
        state_json: str | None,
        meltano: bool,
        stream: str | None = None,
        **kw: Any,
    ) -> None:
        state_id = ops.check_state_id(state_id)
        if stream is not None:
            if meltano:
                raise click.UsageError("--stream and --meltano do not go together")
            bookmark = _parse_bookmark(state_json)
            settings, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
            streams.set_stream(store, state_id, stream, bookmark, ops.Guard.from_settings(settings))
            log.info(f"set the bookmark of stream {stream} in {state_id}")
            return
        value = parse_input(state_json, meltano)
        settings, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
        write(store, state_id, value, ops.Guard.from_settings(settings))
        log.info(f"{done} {state_id}")

    command.__doc__ = doc
    if one_stream:
        command = stream_option(command)
    return state_group.command(name)(command)


def _parse_bookmark(arg: str | None) -> Any:
    data, where = read_input(arg)
    try:
        return jsonio.loads(data)
    except jsonio.DecodeError as exc:
        raise BadInput(f"{where} is not valid JSON ({exc}); nothing was changed") from None


state_set = _write_command(
    "set",
    """Replace the state of STATE_ID (from JSON, or stdin with - or nothing), under the lease.

    With --stream S, replace only that stream's bookmark (bookmarks.S) with JSON and
    keep the others.""",
    ops.set_state,
    "set the state of",
    one_stream=True,
)
state_merge = _write_command(
    "merge",
    "Deep-merge JSON (or stdin) over the state of STATE_ID, under the lease.",
    ops.merge_state,
    "merged into the state of",
)


@state_group.command("clear")
@click.argument("state_id", required=False)
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
@store_options
@click.pass_context
@handle_errors
def state_clear(
    ctx: click.Context,
    /,
    state_id: str | None,
    clear_all: bool,
    pattern: str | None,
    with_history: bool,
    stream_names: tuple[str, ...],
    yes: bool,
    **kw: Any,
) -> None:
    """Remove the state of STATE_ID (or --all), under the lease.

    The history is kept, so `state rollback` can restore a cleared state;
    --history removes it too. --stream S removes only that stream's bookmark,
    so the next run extracts S from the start and resumes the others.
    """
    if bool(state_id) == clear_all:
        raise click.UsageError("give a state ID or --all (not both)")
    if pattern and not clear_all:
        raise click.UsageError("--pattern goes with --all")
    if stream_names and (clear_all or with_history):
        raise click.UsageError("--stream goes with one state ID, without --all or --history")
    settings, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    guard = ops.Guard.from_settings(settings)
    if state_id and stream_names:
        state_id = ops.check_state_id(state_id)
        streams.clear_streams(store, state_id, list(dict.fromkeys(stream_names)), guard)
        names = ", ".join(dict.fromkeys(stream_names))
        kept = history.snapshot_names(store, state_id)
        how = (
            f"; `mapper-state state rollback {state_id} --to {kept[-2]}` undoes it"
            if len(kept) > 1
            else ""
        )
        log.info(f"cleared the bookmark of {names} in {state_id}{how}")
        return
    undo = (
        "this cannot be undone"
        if with_history or guard.history_keep == 0
        else "`state rollback` can restore it from the history"
    )
    if state_id:
        state_id = ops.check_state_id(state_id)
        if with_history:
            confirm(f"Clear {state_id} and its history in {store.display_uri}? ({undo})", yes)
        newest = ops.clear_state(store, state_id, guard, with_history=with_history)
        if newest:
            undo = f"`mapper-state state rollback {state_id} --to {newest}` restores it"
        log.info(f"cleared the state of {state_id}; {undo}")
        return
    ids = ops.list_state_ids(store, pattern)
    if not ids:
        log.info(f"no states to clear in {store.display_uri}")
        return
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    what = plural(len(ids), "state") + (" and their history" if with_history else "")
    confirm(f"Clear {what} in {store.display_uri} ({shown})? ({undo})", yes)
    ops.clear_many(store, ids, guard, with_history=with_history)
    log.info(f"cleared {plural(len(ids), 'state')}; {undo}")


def _transfer_command(name: str, doc: str, transfer: ops.Transfer, done: str) -> click.Command:
    """``state copy`` and ``state move``: SRC onto DST, under the lease."""

    @click.argument("src")
    @click.argument("dst")
    @click.option("--force", is_flag=True, help="Replace DST if it exists.")
    @store_options
    @click.pass_context
    @handle_errors
    def command(ctx: click.Context, /, src: str, dst: str, force: bool, **kw: Any) -> None:
        src, dst = ops.check_state_id(src), ops.check_state_id(dst)
        settings, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
        transfer(store, src, dst, ops.Guard.from_settings(settings), force=force)
        log.info(f"{done} the state of {src} to {dst}")

    command.__doc__ = doc
    return state_group.command(name)(command)


state_copy = _transfer_command(
    "copy", "Copy the state of SRC to DST (DST under the lease).", ops.copy_state, "copied"
)
state_move = _transfer_command(
    "move", "Move the state of SRC to DST, holding both leases.", ops.move_state, "moved"
)


@state_group.command("export")
@click.option("--pattern", metavar="GLOB", help="Only state IDs matching GLOB.")
@click.option(
    "--meltano", is_flag=True, help="One object in `meltano state export`'s format instead."
)
@store_options
@click.pass_context
@handle_errors
def state_export(ctx: click.Context, /, pattern: str | None, meltano: bool, **kw: Any) -> None:
    """Print every state as JSON lines: {"state_id": ..., "singer_state": ...}.

    `state import` reads them back, into this store or another one; --meltano
    prints what `meltano state import` reads instead.
    """
    _, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    count = 0
    if meltano:
        doc = {i: state.meltano_document(v) for i, v in ops.export_states(store, pattern)}
        count = len(doc)
        out(jsonio.dumps(doc) + b"\n")
    else:
        for state_id, value in ops.export_states(store, pattern):
            out(ops.export_line(state_id, value))
            count += 1
    log.info(f"exported {plural(count, 'state')} from {store.display_uri}")


@state_group.command("import")
@click.argument("source", metavar="[FILE|-]", default="-")
@click.option(
    "--state-id",
    "state_id",
    help="The state ID for input without one (what `meltano state get ID` prints).",
)
@click.option("--force", is_flag=True, help="Replace states that exist already.")
@store_options
@click.pass_context
@handle_errors
def state_import(
    ctx: click.Context, /, source: str, state_id: str | None, force: bool, **kw: Any
) -> None:
    """Write the states in FILE (or stdin): `state export` lines, or Meltano's output.

    Everything is checked before anything is written (a bad line is reported by
    its number and nothing is imported); existing states are only replaced with
    --force. Each line is {"state_id": ..., "singer_state": {...}}; a line
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
    if state_id is not None:
        state_id = ops.check_state_id(state_id)
    try:
        data = sys.stdin.buffer.read() if source == "-" else open(source, "rb").read()  # noqa: SIM115
    except OSError as exc:
        raise BadInput(f"cannot read {source}: {exc.strerror}") from None
    entries = ops.parse_import(data, state_id=state_id)
    settings, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    if not entries:
        log.info("nothing to import")
        return
    ops.import_states(store, entries, ops.Guard.from_settings(settings), force=force)
    log.info(f"imported {plural(len(entries), 'state')} into {store.display_uri}")


@state_group.command("history")
@click.argument("state_id")
@format_option
@store_options
@click.pass_context
@handle_errors
def state_history(ctx: click.Context, /, state_id: str, output_format: str, **kw: Any) -> None:
    """List the kept snapshots of STATE_ID, newest first, with what each changed."""
    state_id = ops.check_state_id(state_id)
    _, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    snapshots = history.list_snapshots(store, state_id)
    current = state.load(store, state_id)
    if not snapshots and not current.exists:
        raise ops.not_found(store, state_id)
    rows = []
    previous = None
    for snap in snapshots:
        rows.append((snap, summary.summarize_change(previous, snap.value)))
        previous = snap.value
    rows.reverse()
    current_name = next(
        (s.name for s, _ in rows if current.exists and s.value == current.value), None
    )
    if output_format == "json":
        out(
            jsonio.dumps(
                [
                    {
                        "snapshot": s.name,
                        "time": s.time.isoformat().replace("+00:00", "Z"),
                        "run_id": s.run_id,
                        "host": s.host,
                        "command": s.command,
                        "written_by": s.written_by,
                        "changes": change,
                        "current": s.name == current_name,
                        "singer_state": s.value,
                    }
                    for s, change in rows
                ]
            )
            + b"\n"
        )
        return
    out(_history_table(state_id, rows, current_name, current.exists))


def _history_table(
    state_id: str, rows: list[tuple[history.Snapshot, str]], current: str | None, exists: bool
) -> str:
    if not exists:
        now = "it has no state now (cleared)"
    elif current is None:
        now = "its current state is not in the history"
    else:
        now = "* marks the current state"
    lines = [f"{state_id}: {plural(len(rows), 'snapshot')}, newest first; {now}"]
    if not rows:
        return lines[0] + "\n"
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
    last = len(table[0]) - 1
    widths = [max(len(r[i]) for r in table) for i in range(last)]
    for row in table:
        cells = [row[i].ljust(widths[i]) for i in range(last)]
        lines.append("  ".join([*cells, row[last]]).rstrip())
    return "\n".join(lines) + "\n"


@state_group.command("diff")
@click.argument("state_id")
@click.argument("refs", metavar="[SNAPSHOT [SNAPSHOT]]", nargs=-1)
@format_option
@store_options
@click.pass_context
@handle_errors
def state_diff(
    ctx: click.Context, /, state_id: str, refs: tuple[str, ...], output_format: str, **kw: Any
) -> None:
    """Show which bookmark moved from what to what, stream by stream.

    With no SNAPSHOT, between the two newest snapshots (what the last run changed);
    with one, from it to the current state; with two, from the first to the second.
    A snapshot is a name from `state history` (or its unique start), or `current`.
    """
    state_id = ops.check_state_id(state_id)
    _, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    result = diff.diff(store, state_id, refs)
    if output_format == "json":
        out(jsonio.dumps(_diff_doc(result)) + b"\n")
    else:
        out(_diff_text(result))


def _side_doc(side: diff.Side) -> dict[str, Any]:
    return {
        "snapshot": side.label,
        "time": side.time.isoformat().replace("+00:00", "Z") if side.time else None,
        "run_id": side.run_id,
    }


def _change_doc(change: diff.Change) -> dict[str, Any]:
    return {"path": change.path, "change": change.kind, "from": change.old, "to": change.new}


def _diff_doc(result: diff.StateDiff) -> dict[str, Any]:
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


def _diff_text(result: diff.StateDiff) -> str:
    lines = [f"{result.state_id}: {_side_text(result.old)} -> {_side_text(result.new)}"]
    for stream in result.streams:
        lines += [_change_line(stream.stream, c) for c in stream.changes]
    lines += [_change_line("", c) for c in result.other]
    if not result.moved:
        lines.append("  no bookmark moved")
    if result.unchanged:
        lines.append(f"  {plural(len(result.unchanged), 'stream')} unchanged")
    return "\n".join(lines) + "\n"


@state_group.command("rollback")
@click.argument("state_id")
@click.option(
    "--to", "ref", required=True, metavar="SNAPSHOT", help="A snapshot name (or its start)."
)
@store_options
@click.pass_context
@handle_errors
def state_rollback(ctx: click.Context, /, state_id: str, ref: str, **kw: Any) -> None:
    """Restore STATE_ID to a snapshot from `state history`, under the lease."""
    state_id = ops.check_state_id(state_id)
    settings, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    snap, changed = ops.rollback(store, state_id, ref, ops.Guard.from_settings(settings))
    if changed:
        log.info(f"rolled {state_id} back to snapshot {snap.name} (run {snap.run_id})")
    else:
        log.info(f"{state_id} is already at snapshot {snap.name}; nothing changed")


COMMANDS: tuple[click.Command, ...] = (state_group,)
