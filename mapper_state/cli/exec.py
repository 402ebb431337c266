"""``mapper-state exec -- COMMAND``: any command under the lease, for containers and cron."""

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

#: The state ID, the store and the lease: ``exec`` keeps no state of its own.
EXEC_FLAGS = (
    *(s for s in flagged("run") if s.name in ("state_id", "log_format")),
    *flagged("store", "lease"),
)


@click.command(
    "exec",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
@settings_command(EXEC_FLAGS, codes=(*LEASED_RUN_CODES, ExitCode.INTERRUPTED))
def exec_command(ctx: click.Context, given: SettingsArgs, /, command: tuple[str, ...]) -> None:
    """Run COMMAND holding the lease on the state ID until it ends, like flock(1) across
    machines; exit with COMMAND's status (128+N if signal N killed it).

    SIGINT, SIGTERM and SIGHUP are forwarded to COMMAND's process group. If the lease
    is lost, COMMAND is stopped before the lease expires and the exit code is 4. Every
    mapper-state inside COMMAND that writes this state ID in this store does so under
    this lease (MAPPER_STATE_HELD_LEASE in its environment). Besides the codes
    below and COMMAND's own: 126 or 127 when COMMAND cannot be run.

    \b
    Examples:
      mapper-state exec --state-id prod:pg-to-jsonl --state-backend-uri s3://bucket/states \\
        -- meltano run tap-postgres target-jsonl dbt:run
      mapper-state exec --state-id prod:daily --lock-wait-seconds 600 -- ./load.sh
    """
    if not command:
        raise click.UsageError("exec needs a command: mapper-state exec --state-id ID -- COMMAND")
    settings = command_settings(ctx, given)
    from mapper_state.modes.exec import run_exec

    sys.exit(run_exec(settings, list(command)))
