"""``mapper-state doctor``: check the configured store end to end (the checks are in ``ops.doctor``)."""

from __future__ import annotations

import sys

import click
import orjson

from mapper_state.cli.output import format_option, out
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import ExitCode


@click.command("doctor")
@format_option
@store_command(codes=(ExitCode.UNSAFE_STORE, ExitCode.DOWNSTREAM_CLOSED))
def doctor_command(cx: StoreAccess, output_format: str) -> None:
    """Check the configured store end to end, and that it is safe for locking.

    Exits 0 when it is safe (perhaps with a warning), 5 when the store fails and
    11 when it is unsafe for locking.

    \b
    Examples:
      mapper-state doctor --state-backend-uri s3://bucket/states
      mapper-state doctor --format json
    """
    from mapper_state.ops.doctor import render_text, run_checks

    report = run_checks(cx.store)
    if output_format == "json":
        out(cx.settings.redact(orjson.dumps(report.to_dict()).decode()) + "\n")
    else:
        out(cx.settings.redact(render_text(report)) + "\n")
    if report.exit_code:
        sys.exit(report.exit_code)
