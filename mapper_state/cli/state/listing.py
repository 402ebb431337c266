"""``state list``: the state IDs in the store; ``--long`` and ``--stale`` survey the fleet."""

from __future__ import annotations

import sys
import time

import click

from mapper_state import jsonio, log
from mapper_state.cli import render
from mapper_state.cli.output import format_option, out
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import ExitCode
from mapper_state.ops import commands as ops
from mapper_state.ops import fleet


@click.command("list")
@click.option("--pattern", metavar="GLOB", help="Only state IDs matching GLOB (* ? [...]).")
@click.option(
    "--long",
    is_flag=True,
    help="Last written (time, age), writer's run ID, lease holder, snapshots kept.",
)
@click.option(
    "--stale",
    metavar="DURATION",
    help="Only states that have not moved for DURATION (90s, 15m, 36h, 2d, 1w); "
    "exit 12 when there are any.",
)
@click.option(
    "--failed",
    is_flag=True,
    help="Only states whose last run failed, was signalled, lost its lease or was killed; "
    "exit 12 when there are any.",
)
@format_option
@store_command(codes=(ExitCode.STALE, ExitCode.DOWNSTREAM_CLOSED))
def state_list(
    cx: StoreAccess,
    pattern: str | None,
    long: bool,
    stale: str | None,
    failed: bool,
    output_format: str,
) -> None:
    """List the state IDs in the store.

    --long shows, for each, when it was last written and how long ago, the run
    that wrote it, who holds its lease and until when, and the snapshots kept.
    --stale DURATION shows the same for the pipelines whose state has not moved
    for that long, and exits 12 when there are any (for a cron check or an alert).
    --failed does so for the pipelines whose last recorded run did not succeed
    (failed, signalled, lease-lost, killed); with --stale, a pipeline either selects.

    \b
    Examples:
      mapper-state state list --pattern 'prod:*'
      mapper-state state list --long --state-backend-uri s3://bucket/states
      mapper-state state list --stale 36h || alert "a pipeline is stuck"
      mapper-state state list --failed --format json
    """
    if stale is not None or long or failed:
        _fleet(cx, pattern, stale, failed, output_format)
        return
    ids = ops.list_state_ids(cx.store, pattern)
    if output_format == "json":
        out(jsonio.dumps(ids) + b"\n")
    elif ids:
        out("".join(f"{i}\n" for i in ids))
    else:
        log.info(f"no states{' match ' + pattern if pattern else ''} in {cx.store.display_uri}")


def _fleet(
    cx: StoreAccess, pattern: str | None, stale: str | None, failed: bool, output_format: str
) -> None:
    limit = fleet.parse_duration(stale) if stale is not None else None
    store = cx.store
    now = time.time()
    pipelines = fleet.survey(store, pattern)
    if failed:  # the last runs' outcomes are in their records: every pipeline is read
        read = fleet.details(store, pipelines)
        chosen = {p.state_id for p in fleet.failed(read)}
        if limit is not None:
            chosen |= {p.state_id for p in fleet.stale(read, limit, now)}
        _selected(
            cx,
            pattern,
            [p for p in read if p.state_id in chosen],
            pipelines,
            now,
            output_format,
            "failed" if limit is None else f"failed or not moved for {stale}",
        )
        return
    shown = pipelines if limit is None else fleet.stale(pipelines, limit, now)
    shown = fleet.details(store, shown)
    if output_format == "json":
        out(jsonio.dumps([render.pipeline_doc(p, now) for p in shown]) + b"\n")
    elif shown:
        out(render.fleet_table(shown, now))
    if limit is None:
        if not pipelines:
            log.info(f"no states{' match ' + pattern if pattern else ''} in {store.display_uri}")
        return
    everyone = render.plural(len(pipelines), "state")
    if shown:
        log.warning(f"{len(shown)} of {everyone} in {store.display_uri} have not moved for {stale}")
        sys.exit(ExitCode.STALE)
    log.info(f"every one of {everyone} moved within {stale}")


def _selected(
    cx: StoreAccess,
    pattern: str | None,
    shown: list[fleet.Pipeline],
    pipelines: list[fleet.Pipeline],
    now: float,
    output_format: str,
    why: str,
) -> None:
    """Print the pipelines ``--failed`` selected; exit 12 when there are any."""
    if output_format == "json":
        out(jsonio.dumps([render.pipeline_doc(p, now) for p in shown]) + b"\n")
    elif shown:
        out(render.fleet_table(shown, now))
    everyone = render.plural(len(pipelines), "state")
    if shown:
        log.warning(f"{len(shown)} of {everyone} in {cx.store.display_uri}: last run {why}")
        sys.exit(ExitCode.STALE)
    log.info(f"no last run of {everyone} {why}")
