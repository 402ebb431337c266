"""The command line: parsing, exit codes and wiring; the logic lives in the other modules.

``mapper-state`` alone is the filter (shell pipelines, Meltano mapper);
``run``, ``state``, ``lock`` and ``doctor`` are subcommands.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from mapper_state import __version__, log
from mapper_state.config import Settings, load_settings
from mapper_state.errors import ExitCode, MapperStateError

F = TypeVar("F", bound=Callable[..., Any])

# flag -> setting name, shared by every command that talks to a store
_STORE_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    (
        "--state-backend-uri",
        "state_backend.uri",
        str,
        "Store URI (file://, s3://, azure://, gs://).",
    ),
    ("--lock-timeout-seconds", "state_backend.lock_timeout_seconds", float, "Lease TTL."),
    (
        "--lock-retry-seconds",
        "state_backend.lock_retry_seconds",
        float,
        "Poll interval for a busy lease.",
    ),
    (
        "--lock-wait-seconds",
        "state_backend.lock_wait_seconds",
        float,
        "Wait this long for a busy lease.",
    ),
)


def store_options(func: F) -> F:
    """Add ``--config`` and the store flags; the command receives ``settings_flags``."""

    @click.option(
        "--config",
        "config_files",
        multiple=True,
        metavar="FILE",
        help="JSON settings file (repeatable; ENV: settings from the environment only).",
    )
    @click.option(
        "--set",
        "set_options",
        multiple=True,
        metavar="NAME=VALUE",
        help="Any setting by its dotted name, e.g. state_backend.s3.region=eu-west-1.",
    )
    @functools.wraps(func)
    def wrapper(
        *args: Any, config_files: tuple[str, ...], set_options: tuple[str, ...], **kwargs: Any
    ) -> Any:
        flags = {name: kwargs.pop(name.replace(".", "_"), None) for _, name, _, _ in _STORE_FLAGS}
        for item in set_options:
            key, sep, value = item.partition("=")
            if not sep:
                raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--set")
            flags[key.strip()] = value
        kwargs["settings_flags"] = flags
        kwargs["config_files"] = config_files
        return func(*args, **kwargs)

    for flag, name, kind, help_text in reversed(_STORE_FLAGS):
        wrapper = click.option(
            flag, name.replace(".", "_"), type=kind, default=None, help=help_text
        )(wrapper)
    return wrapper  # type: ignore[return-value]


def resolve_settings(flags: dict[str, Any], config_files: tuple[str, ...]) -> Settings:
    """Settings from every source; a ``--set`` with an unknown name is a config error."""
    from mapper_state.config import SETTINGS_BY_NAME
    from mapper_state.errors import ConfigError

    unknown = [k for k, v in flags.items() if v is not None and k not in SETTINGS_BY_NAME]
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]}")
    settings = load_settings(flags, config_files)
    log.configure(settings)
    return settings


def command_settings(
    ctx: click.Context, flags: dict[str, Any], config_files: tuple[str, ...]
) -> Settings:
    """Settings for a subcommand: its own flags and files over those given before its name."""
    parent = ctx.find_root().obj or {}
    merged = {k: v for k, v in parent.get("settings_flags", {}).items() if v is not None}
    merged.update({k: v for k, v in flags.items() if v is not None})
    return resolve_settings(merged, (*parent.get("config_files", ()), *config_files))


def handle_errors(func: F) -> F:
    """Turn :class:`MapperStateError` into one line on stderr and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except MapperStateError as exc:
            log.error(exc.message)
            sys.exit(int(exc.exit_code))
        except KeyboardInterrupt:
            log.error("interrupted")
            sys.exit(ExitCode.INTERRUPTED)

    return wrapper  # type: ignore[return-value]


class _Main(click.Group):
    """A group whose bare invocation is the filter."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage("mapper-state", "[OPTIONS] | COMMAND [ARGS]...")


@click.group(
    cls=_Main, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option("--state-id", help="The pipeline's state ID.")
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
@click.option("--full-refresh", is_flag=True, default=None, help="Hand the tap no prior state.")
@click.option(
    "--dry-run",
    is_flag=True,
    default=None,
    help="Take the lease and read the state but write nothing.",
)
@click.option("--strict", is_flag=True, default=None, help="An unusable STATE message is fatal.")
@click.option(
    "--checkpoint-interval-seconds",
    type=float,
    default=None,
    help="At most one state write per interval.",
)
@click.option(
    "--state-merge", is_flag=True, default=None, help="Deep-merge each state over the prior one."
)
@click.option(
    "--lock-only/--no-lock-only",
    default=None,
    help="Hold the lease but leave state.json to another writer.",
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default=None, help="Log format on stderr."
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
@store_options
@click.pass_context
@handle_errors
def main(
    ctx: click.Context,
    state_id: str | None,
    state_file: str | None,
    after_target: bool | None,
    input_path: str | None,
    full_refresh: bool | None,
    dry_run: bool | None,
    strict: bool | None,
    checkpoint_interval_seconds: float | None,
    state_merge: bool | None,
    lock_only: bool | None,
    log_format: str | None,
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
        from mapper_state.mapper import print_about

        print_about(about_format)
        return
    settings_flags.update(
        {
            "state_id": state_id,
            "full_refresh": full_refresh,
            "dry_run": dry_run,
            "strict": strict,
            "checkpoint_interval_seconds": checkpoint_interval_seconds,
            "state_merge": state_merge,
            "lock_only": lock_only,
            "log_format": log_format,
        }
    )
    settings = resolve_settings(settings_flags, config_files)
    from mapper_state.filter import run_filter

    sys.exit(
        run_filter(
            settings,
            state_file=state_file,
            after_target=bool(after_target),
            input_path=input_path,
        )
    )


def register_commands() -> None:
    """Attach the subcommands (their modules import nothing heavy at import time)."""
    from mapper_state import cli_ops, cli_run

    for command in (*cli_ops.COMMANDS, *cli_run.COMMANDS):
        main.add_command(command)


register_commands()
