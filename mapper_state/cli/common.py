"""What every command shares: store flags, settings resolution and error handling.

These live apart from ``cli.py`` so that the subcommand modules can use them at
import time without importing ``cli.py`` (which imports the subcommands).
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import click

from mapper_state import log
from mapper_state.config import load_settings
from mapper_state.errors import ExitCode, MapperStateError
from mapper_state.meltano import env as meltano_env
from mapper_state.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])

# flag -> setting name, shared by every command that talks to a store
_STORE_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    (
        "--state-backend-uri",
        "state_backend.uri",
        str,
        "Store URI (file://, s3://, azure://, gs://, postgresql://).",
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


_RUN_OPTIONS = (
    click.option("--state-id", "state_id", help="The pipeline's state ID."),
    click.option(
        "--full-refresh", "full_refresh", is_flag=True, default=None, help="Hand the tap no state."
    ),
    click.option(
        "--full-refresh-stream",
        "full_refresh_streams",
        multiple=True,
        metavar="STREAM",
        help="Hand the tap the state without STREAM's bookmark, keep the others (repeatable).",
    ),
    click.option(
        "--dry-run",
        "dry_run",
        is_flag=True,
        default=None,
        help="Take the lease and read the state but write nothing.",
    ),
    click.option(
        "--checkpoint-interval-seconds",
        "checkpoint_interval_seconds",
        type=float,
        default=None,
        help="At most one state write per interval.",
    ),
    click.option(
        "--state-merge",
        "state_merge",
        is_flag=True,
        default=None,
        help="Deep-merge each state over the prior one.",
    ),
    click.option(
        "--lock-only/--no-lock-only",
        "lock_only",
        default=None,
        help="Hold the lease but leave state.json to another writer.",
    ),
    click.option(
        "--metrics-file",
        "metrics_file",
        type=click.Path(dir_okay=False),
        default=None,
        help="Write Prometheus metrics here at each commit and at exit.",
    ),
    click.option(
        "--log-format",
        "log_format",
        type=click.Choice(["text", "json"]),
        default=None,
        help="Log format on stderr.",
    ),
)
_RUN_SETTINGS = (
    "state_id",
    "full_refresh",
    "full_refresh_streams",
    "dry_run",
    "checkpoint_interval_seconds",
    "state_merge",
    "lock_only",
    "metrics_file",
    "log_format",
)


def run_options(func: F) -> F:
    """The flags of a run (filter or ``run``); place below ``store_options``.

    Their values join ``settings_flags`` under the settings' own names.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, settings_flags: dict[str, Any], **kwargs: Any) -> Any:
        settings_flags.update({name: kwargs.pop(name) for name in _RUN_SETTINGS})
        settings_flags["full_refresh_streams"] = (
            list(settings_flags["full_refresh_streams"]) or None
        )
        return func(*args, settings_flags=settings_flags, **kwargs)

    for option in reversed(_RUN_OPTIONS):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


def resolve_settings(flags: dict[str, Any], config_files: tuple[str, ...]) -> Settings:
    """Settings from every source, Meltano's environment the lowest; an unknown name is an error."""
    settings = load_settings(flags, config_files, sources=[meltano_env.SOURCE])
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
            log.error(exc.message, detail=exc.detail)
            sys.exit(int(exc.exit_code))
        except KeyboardInterrupt:
            log.error("interrupted")
            sys.exit(ExitCode.INTERRUPTED)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # usage errors and --help: click reports them itself
        except Exception as exc:  # a bug: one line, secrets hidden, the traceback on request
            if os.environ.get("MAPPER_STATE_DEBUG"):
                log.traceback_text("".join(traceback.format_exception(exc)))
            log.error(
                f"internal error: {type(exc).__name__}: {exc} (a bug: please report it; "
                "MAPPER_STATE_DEBUG=1 shows where it happened)"
            )
            sys.exit(ExitCode.INTERNAL)

    return wrapper  # type: ignore[return-value]
