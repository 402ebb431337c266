"""``mapper-state metrics [serve]``: the fleet's metrics for Prometheus, from the store."""

from __future__ import annotations

import click

from mapper_state import log, signals
from mapper_state.cli.output import out
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import Interrupted
from mapper_state.modes import fleet_metrics
from mapper_state.ops.watch import FleetWatch


@click.command("metrics")
@click.argument("action", required=False, type=click.Choice(["serve"]))
@click.option("--pattern", metavar="GLOB", help="Only state IDs matching GLOB (* ? [...]).")
@click.option(
    "--max-age",
    "max_ages",
    multiple=True,
    metavar="[GLOB=]DURATION",
    help="How long a pipeline may go without a commit (mapper_state_max_age_seconds, for "
    "the stale alert): GLOB=DURATION for the state IDs matching GLOB (the first match "
    "wins), DURATION alone for the others (default 36h). Repeatable.",
)
@click.option(
    "--listen",
    default=fleet_metrics.DEFAULT_LISTEN,
    show_default=True,
    metavar="HOST:PORT",
    help="serve: where to answer scrapes (0.0.0.0:PORT for every interface).",
)
@click.option(
    "--cache-seconds",
    type=click.FloatRange(min=0),
    default=fleet_metrics.CACHE_SECONDS,
    show_default=True,
    help="serve: answer a scrape this soon after the last look at the store from it.",
)
@store_command()
def metrics_command(
    cx: StoreAccess,
    action: str | None,
    pattern: str | None,
    max_ages: tuple[str, ...],
    listen: str,
    cache_seconds: float,
) -> None:
    """Print the fleet's metrics in Prometheus text format, or serve them over HTTP.

    For every state ID in the store, labelled state_id: the last commit's time, the
    last run's start, end, outcome, exit code and duration, whether the lease is held,
    until when and by which host, and the pipeline's staleness bound (--max-age). One
    look at the store costs two listings plus a read of each lease and last run record
    that changed since the previous look (docs/operations.md, "Watching a fleet").

    `metrics serve` answers Prometheus's scrapes at http://HOST:PORT/metrics (read-only;
    127.0.0.1 unless --listen says otherwise) until stopped.

    \b
    Examples:
      mapper-state metrics --state-backend-uri s3://bucket/states
      mapper-state metrics serve --listen 0.0.0.0:9478 --max-age 'hourly:*=3h' --max-age 36h
    """
    ages = fleet_metrics.MaxAges.parse(max_ages)
    if action is None:
        watch = FleetWatch(cx.store, pattern)
        out(fleet_metrics.Exposition(watch, ages, cache_seconds=0).text())
        return
    fleet_metrics.parse_listen(listen)  # a bad address before the store is opened
    exposition = fleet_metrics.Exposition(FleetWatch(cx.store, pattern), ages, cache_seconds)

    def ready(where: str) -> None:
        log.info(f"serving the metrics of {cx.store.display_uri} at http://{where}/metrics")

    try:
        with signals.raising():
            fleet_metrics.serve(exposition, listen, ready)
    except Interrupted as exc:
        log.info(f"stopped by signal {exc.signum}")
