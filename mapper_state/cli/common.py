"""What every command shares: settings flags, settings resolution, error handling, exit codes.

The flags are derived from the settings' declarations (:class:`mapper_state.settings.Flag`):
a setting with a flag shows it on the commands of its group (``store``: every command
that opens a store; ``lease``: the commands that take the lease; ``run``: the filter and
``run``), and every command takes ``--config FILE`` and ``--set NAME=VALUE``.
:func:`settings_command` turns a typed function into a click callback that receives
the resolved flags as one :class:`SettingsArgs`; :mod:`mapper_state.cli.store` builds
the operator commands on it.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, NoReturn, ParamSpec, TypeVar

import click

from mapper_state import log
from mapper_state.config import load_settings
from mapper_state.errors import ExitCode, MapperStateError
from mapper_state.meltano import env as meltano_env
from mapper_state.meltano import project as meltano_project
from mapper_state.redact import display_uri
from mapper_state.settings import (
    RUN_SETTINGS,
    URI_SETTING,
    FlagGroup,
    Settings,
    SettingSpec,
    SettingsSource,
)

P = ParamSpec("P")
R = TypeVar("R")

#: The exit codes every command that keeps a state under the lease can end with (the
#: filter and ``run``), before its own.
LEASED_RUN_CODES = (
    ExitCode.OK,
    ExitCode.CONFIG,
    ExitCode.LEASE_BUSY,
    ExitCode.LEASE_LOST,
    ExitCode.STORE,
)

#: What each exit code means, as ``--help`` lists it (docs/exit-codes.md has the details).
EXIT_MEANINGS: dict[int, str] = {
    ExitCode.OK: "ok",
    ExitCode.INTERNAL: "internal error (a bug)",
    ExitCode.CONFIG: "usage: a flag, setting or state ID is wrong",
    ExitCode.LEASE_BUSY: "the lease is busy",
    ExitCode.LEASE_LOST: "the lease was lost",
    ExitCode.STORE: "the store failed",
    ExitCode.BAD_INPUT: "bad input: the JSON, a line, a snapshot or an existing ID",
    ExitCode.TAP_FAILED: "the tap failed",
    ExitCode.TARGET_FAILED: "the target failed",
    ExitCode.DOWNSTREAM_CLOSED: "the reader went away",
    ExitCode.NOT_FOUND: "no such state",
    ExitCode.UNSAFE_STORE: "the store is unsafe for locking",
    ExitCode.STALE: "some states have not moved",
    ExitCode.INTERRUPTED: "interrupted (128+N: killed by signal N)",
}


def exit_codes_help(codes: Iterable[int]) -> str:
    """The ``Exit codes:`` paragraph of a command's ``--help``."""
    lines = [f"  {code:<3} {EXIT_MEANINGS[code]}" for code in sorted(set(codes))]
    return "\b\nExit codes:\n" + "\n".join(lines)


def with_exit_codes(doc: str | None, codes: Iterable[int]) -> str:
    """A docstring with the exit codes paragraph appended (click keeps ``\\b`` blocks as is)."""
    return inspect.cleandoc(doc or "") + "\n\n" + exit_codes_help(codes)


# -- the settings flags, from the declarations -----------------------------------------


def flagged(*groups: FlagGroup, exclude: Iterable[str] = ()) -> tuple[SettingSpec, ...]:
    """The run's settings whose flag belongs to one of ``groups``, in declaration order."""
    skip = frozenset(exclude)
    return tuple(
        s for s in RUN_SETTINGS if s.flag and s.flag.group in groups and s.name not in skip
    )


def _param_type(spec: SettingSpec) -> click.Choice[str] | click.Path | type[Any] | None:
    assert spec.flag is not None
    if spec.choices:
        return click.Choice(list(spec.choices))
    if spec.flag.path:
        return click.Path(dir_okay=False)
    return {"number": float, "integer": int, "string": str}.get(spec.kind)


def setting_option(spec: SettingSpec) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """The click option of a setting's flag; its value lands under the setting's ``param_name``."""
    flag = spec.flag
    assert flag is not None
    attrs: dict[str, Any] = {"default": None, "help": flag.help}
    if spec.kind != "boolean":
        attrs.update(type=_param_type(spec), multiple=flag.repeatable, metavar=flag.metavar)
    elif "/" not in flag.opts:
        attrs["is_flag"] = True
    return click.option(flag.opts, spec.param_name, **attrs)


@dataclass(frozen=True)
class SettingsArgs:
    """What the command line says about settings: the flags given, by setting name, and files."""

    flags: dict[str, Any] = field(default_factory=dict)
    config_files: tuple[str, ...] = ()


def _settings_args(
    kwargs: dict[str, Any],
    specs: Sequence[SettingSpec],
    config: tuple[str, ...],
    sets: tuple[str, ...],
) -> SettingsArgs:
    """Take the settings' flags out of a callback's keyword arguments, with ``--set``'s."""
    flags: dict[str, Any] = {}
    for spec in specs:
        value = kwargs.pop(spec.param_name)
        if spec.flag and spec.flag.repeatable:
            value = list(value) or None
        flags[spec.name] = value
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--set")
        flags[key.strip()] = value
    return SettingsArgs(flags, config)


SettingsBody = Callable[Concatenate[click.Context, SettingsArgs, ...], None]


def settings_command(
    specs: Sequence[SettingSpec], codes: Iterable[int] = ()
) -> Callable[[SettingsBody], Callable[..., None]]:
    """A click callback for ``body(ctx, settings_args, *its own arguments)``.

    It adds ``--config``, ``--set`` and the flags of ``specs`` (below the command's own
    options in ``--help``), gathers them into one :class:`SettingsArgs`, turns a
    :class:`MapperStateError` into one line and its exit code, and lists ``codes`` in
    ``--help``.
    """

    def decorate(body: SettingsBody) -> Callable[..., None]:
        @handle_errors
        def callback(
            *, config_files: tuple[str, ...], set_options: tuple[str, ...], **kwargs: Any
        ) -> None:
            given = _settings_args(kwargs, specs, config_files, set_options)
            body(click.get_current_context(), given, **kwargs)

        callback.__name__ = body.__name__
        callback.__doc__ = with_exit_codes(body.__doc__, codes) if codes else body.__doc__
        for spec in reversed(specs):
            callback = setting_option(spec)(callback)
        callback = click.option(
            "--set",
            "set_options",
            multiple=True,
            metavar="NAME=VALUE",
            help="Any setting by its dotted name, e.g. state_backend.s3.region=eu-west-1.",
        )(callback)
        return click.option(
            "--config",
            "config_files",
            multiple=True,
            metavar="FILE",
            help="JSON settings file (repeatable; ENV: settings from the environment only).",
        )(callback)

    return decorate


# -- resolving settings ------------------------------------------------------------------


def resolve_settings(flags: dict[str, Any], config_files: tuple[str, ...]) -> Settings:
    """Settings from every source, Meltano's environment the lowest; an unknown name is an error.

    What looks like a typo (an unknown ``MAPPER_STATE_*`` variable, a config key close to
    a setting's name) is a warning naming the setting it probably meant.
    """
    project = meltano_project.ProjectSource()
    # a URI given on the command line: no Meltano project file is read, nor warned about
    explicit = bool((flags or {}).get(URI_SETTING))
    sources: list[SettingsSource] = [meltano_env.SOURCE]
    if not explicit:
        sources.insert(0, project)
    settings = meltano_env.expand_state_id(load_settings(flags, config_files, sources=sources))
    log.configure(settings)
    log.singer_sdk_lines(meltano_env.parses_structured_lines())
    for warning in settings.warnings:
        log.warning(warning)
    if settings.sources.get(URI_SETTING) == project.label and project.file is not None:
        log.info(f"store {display_uri(settings.uri)}: state_backend.uri of {project.label}")
    return settings


def command_settings(ctx: click.Context, given: SettingsArgs) -> Settings:
    """Settings for a subcommand: its own flags and files over those given before its name."""
    parent = ctx.find_root().obj
    outer = parent if isinstance(parent, SettingsArgs) else SettingsArgs()
    merged = {k: v for k, v in outer.flags.items() if v is not None}
    merged.update({k: v for k, v in given.flags.items() if v is not None})
    return resolve_settings(merged, (*outer.config_files, *given.config_files))


# -- errors --------------------------------------------------------------------------------


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn :class:`MapperStateError` into one line on stderr and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
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
        # Broad on purpose (BLE001): the last resort, whatever a bug raises becomes one
        # line with every secret hidden and exit 1, never a traceback that shows a secret.
        except Exception as exc:  # noqa: BLE001, RUF100
            _internal_error(exc)

    return wrapper


def _internal_error(exc: Exception) -> NoReturn:
    """A bug: one line, secrets hidden, the traceback on request (``MAPPER_STATE_DEBUG``)."""
    if os.environ.get(log.DEBUG_VAR):
        log.traceback_text("".join(traceback.format_exception(exc)))
    log.error(
        f"internal error: {type(exc).__name__}: {exc} (a bug: please report it; "
        f"{log.DEBUG_VAR}=1 shows where it happened)"
    )
    sys.exit(ExitCode.INTERNAL)
