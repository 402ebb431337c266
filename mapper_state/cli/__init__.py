"""The command line: parsing, exit codes and wiring; the logic lives in the other modules.

``mapper-state`` alone is the filter (shell pipelines, Meltano mapper);
``run``, ``exec``, ``state``, ``lock`` and ``doctor`` are subcommands, one module each
(``state``'s a package of one module per command). How a command is declared:
:mod:`mapper_state.cli.store`; the flags come from the settings' declarations
(:mod:`mapper_state.cli.common`).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from mapper_state import __version__
from mapper_state.cli.common import (
    LEASED_RUN_CODES,
    SettingsArgs,
    command_settings,
    flagged,
    handle_errors,
    resolve_settings,
    settings_command,
)
from mapper_state.errors import ExitCode, MapperStateError

__all__ = ["command_settings", "handle_errors", "main", "resolve_settings"]

#: The filter's flags: the store, the lease and the run's own (not ``run``'s tap and target).
FILTER_FLAGS = flagged("store", "lease", "run", exclude=("tap", "target"))


#: Each subcommand's name, module and attribute: a module is imported when its command is
#: looked up (run, ``--help``, completion), so the filter, the command run most, starts
#: without them (a third less to import).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("mapper_state.cli.doctor", "doctor_command"),
    "exec": ("mapper_state.cli.exec", "exec_command"),
    "lock": ("mapper_state.cli.lock", "lock_group"),
    "metrics": ("mapper_state.cli.metrics", "metrics_command"),
    "run": ("mapper_state.cli.run", "run_command"),
    "runs": ("mapper_state.cli.runs", "runs_command"),
    "state": ("mapper_state.cli.state", "state_group"),
}


class _Main(click.Group):
    """A group whose bare invocation is the filter, its subcommands imported when needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *SUBCOMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in SUBCOMMANDS:
            module, attribute = SUBCOMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage("mapper-state", "[OPTIONS]")
        formatter.write_usage("mapper-state", "COMMAND [ARGS]...", prefix="   or: ")

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Like click's, but a usage error is one line on stderr (exit 2), as every error is."""
        if kwargs.get("standalone_mode", True) is False:
            return super().main(*args, **kwargs)
        try:
            kwargs["standalone_mode"] = False
            return super().main(*args, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("mapper-state: error: aborted", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            message = " ".join(exc.format_message().split())
            click.echo(f"mapper-state: error: {message}{where}", err=True)
            sys.exit(exc.exit_code)


@click.group(
    cls=_Main, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option(
    "--state-file",
    type=click.Path(dir_okay=False),
    help="Hand the prior state to the tap here (a FIFO, /dev/fd/N or a file).",
)
@click.option(
    "--after-target",
    is_flag=True,
    default=None,
    help="Input lines are bare states confirmed by a target.",
)
@click.option(
    "--input",
    "input_path",
    type=click.Path(dir_okay=False),
    help="Read the stream from FILE instead of stdin.",
)
@click.option("--about", is_flag=True, help="Describe the mapper and its settings.")
@click.option(
    "--format",
    "about_format",
    type=click.Choice(["text", "json", "markdown"]),
    default="text",
    help="--about output format.",
)
@click.option("--discover", is_flag=True, hidden=True)
@click.version_option(
    __version__, "--version", prog_name="mapper-state", message="%(prog)s %(version)s"
)
@settings_command(
    FILTER_FLAGS,
    codes=(
        *LEASED_RUN_CODES,
        ExitCode.BAD_INPUT,
        ExitCode.DOWNSTREAM_CLOSED,
        ExitCode.INTERRUPTED,
    ),
)
def main(
    ctx: click.Context,
    given: SettingsArgs,
    /,
    state_file: str | None,
    after_target: bool | None,
    input_path: str | None,
    about: bool,
    about_format: str,
    discover: bool,
) -> None:
    """Keep a Singer pipeline's state in a remote store, one run at a time.

    Bare, it is the filter: tap | mapper-state --state-id ID | target.
    The subcommands run a whole pipeline (run) or any command under the lease
    (exec), read and change states (state), inspect or break a lease (lock) and
    check a store (doctor); the flags given
    before a subcommand's name apply to it too. The exit codes below are the filter's.

    \b
    Examples:
      tap-x --state state.json | mapper-state --state-id dev:x | target-y
      tap-x --state <(mapper-state state get dev:x) | mapper-state --state-id dev:x | target-y
      mapper-state run --state-id dev:x --tap tap-x --target target-y
      mapper-state exec --state-id dev:x -- meltano run tap-x target-y dbt:run
      mapper-state state list --long
      mapper-state doctor --state-backend-uri s3://bucket/states

    \b
    Shell completion (bash; zsh_source and fish_source for the others):
      eval "$(_MAPPER_STATE_COMPLETE=bash_source mapper-state)"
    """
    if ctx.invoked_subcommand is not None:
        ctx.obj = given
        return
    if about:
        from mapper_state.meltano.about import print_about

        print_about(about_format)
        return
    try:
        settings = resolve_settings(given.flags, given.config_files)
    except MapperStateError:
        from mapper_state.modes.filter import release_tap

        release_tap(state_file)  # a tap waiting on the pipe must fail, not hang
        raise
    from mapper_state.meltano.policy import HOOKS
    from mapper_state.modes.filter import run_filter

    sys.exit(
        run_filter(
            settings,
            state_file=state_file,
            hooks=HOOKS,
            after_target=bool(after_target),
            input_path=input_path,
        )
    )
