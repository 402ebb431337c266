"""``mapper-state run``: the whole tap-to-target job (SPEC 1.1), for containers and cron."""

from __future__ import annotations

import sys
from typing import Any

import click

from mapper_state.cli.common import command_settings, handle_errors, run_options, store_options


@click.command("run")
@click.option("--tap", help='The tap\'s command line, e.g. "tap-postgres --config tap.json".')
@click.option("--target", help='The target\'s command line, e.g. "target-jsonl --config t.json".')
@store_options
@run_options
@click.pass_context
@handle_errors
def run_command(
    ctx: click.Context,
    /,
    settings_flags: dict[str, Any],
    config_files: tuple[str, ...],
    **flags: Any,
) -> None:
    """Run TAP | TARGET under the lease, committing the states the target confirms.

    Exit codes: 0 ok, 2 configuration, 3 lease busy, 4 lease lost, 5 store,
    7 tap failed, 8 target failed, 128+N killed by signal N.
    """
    settings_flags.update(flags)
    settings = command_settings(ctx, settings_flags, config_files)
    from mapper_state.meltano.policy import HOOKS
    from mapper_state.modes.pipeline import run_pipeline

    sys.exit(run_pipeline(settings, hooks=HOOKS))


COMMANDS: tuple[click.Command, ...] = (run_command,)
