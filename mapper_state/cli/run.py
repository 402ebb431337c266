"""``mapper-state run``: the whole tap-to-target job, for containers and cron."""

from __future__ import annotations

import sys

import click

from mapper_state.cli.common import (
    LEASED_RUN_CODES,
    SettingsArgs,
    command_settings,
    flagged,
    settings_command,
)
from mapper_state.errors import ExitCode

#: The flags of ``run``: the store, the lease and the run's own (not the filter's ``--strict``).
RUN_FLAGS = flagged("store", "lease", "run", exclude=("strict",))


@click.command("run")
@settings_command(
    RUN_FLAGS,
    codes=(
        *LEASED_RUN_CODES,
        ExitCode.TAP_FAILED,
        ExitCode.TARGET_FAILED,
        ExitCode.INTERRUPTED,
    ),
)
def run_command(ctx: click.Context, given: SettingsArgs, /) -> None:
    """Run TAP | TARGET under the lease, committing the states the target confirms.

    \b
    Examples:
      mapper-state run --state-id prod:pg-to-jsonl \\
        --tap "tap-postgres --config tap.json" --target "target-jsonl --config t.json" \\
        --state-backend-uri s3://bucket/states
      MAPPER_STATE_STATE_ID=prod:pg-to-jsonl mapper-state run --config run.json
    """
    settings = command_settings(ctx, given)
    from mapper_state.meltano.policy import HOOKS
    from mapper_state.modes.pipeline import run_pipeline

    sys.exit(run_pipeline(settings, hooks=HOOKS))
