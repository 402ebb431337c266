"""The command line: parsing, exit codes and wiring; the logic lives in the other modules.

``mapper-state`` alone is the filter (shell pipelines, Meltano mapper);
``run``, ``state``, ``lock`` and ``doctor`` are subcommands.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from mapper_state import __version__
from mapper_state.cli.common import (  # also re-exported for the subcommand modules
    command_settings,
    handle_errors,
    resolve_settings,
    run_options,
    store_options,
)
from mapper_state.errors import MapperStateError

__all__ = ["command_settings", "handle_errors", "main", "resolve_settings", "store_options"]


class _Main(click.Group):
    """A group whose bare invocation is the filter."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage("mapper-state", "[OPTIONS] | COMMAND [ARGS]...")

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
@click.option("--strict", is_flag=True, default=None, help="An unusable STATE message is fatal.")
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
@store_options
@run_options
@click.pass_context
@handle_errors
def main(
    ctx: click.Context,
    state_file: str | None,
    after_target: bool | None,
    input_path: str | None,
    strict: bool | None,
    about: bool,
    about_format: str,
    discover: bool,
    settings_flags: dict[str, Any],
    config_files: tuple[str, ...],
) -> None:
    """Keep a Singer pipeline's state in a remote store, one run at a time.

    Bare, it is the filter: tap | mapper-state --state-id ID | target.
    """
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"settings_flags": settings_flags, "config_files": config_files}
        return
    if about:
        from mapper_state.meltano.about import print_about

        print_about(about_format)
        return
    settings_flags["strict"] = strict
    try:
        settings = resolve_settings(settings_flags, config_files)
    except MapperStateError:
        if state_file:  # a tap waiting on the pipe must fail, not hang
            from mapper_state.stream.handoff import release_reader

            release_reader(state_file)
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


def register_commands() -> None:
    """Attach the subcommands (their modules import nothing heavy at import time)."""
    from mapper_state.cli import lock as cli_lock
    from mapper_state.cli import migrate as _  # noqa: F401 - adds `state migrate`
    from mapper_state.cli import run as cli_run
    from mapper_state.cli import state as cli_state

    for command in (*cli_state.COMMANDS, *cli_lock.COMMANDS, *cli_run.COMMANDS):
        main.add_command(command)


register_commands()
