"""What the operator commands (``state``, ``lock``, ``doctor``) share: options, output, prompts.

Those commands live in ``cli_state`` and ``cli_lock``; only parsing, confirmation
and output live there, the logic is in ``ops``, ``history`` and ``doctor``.
Human-friendly output by default, ``--format json`` for scripts; messages go to
stderr so that stdout holds only what was asked for.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from mapper_state import jsonio
from mapper_state.cli.common import command_settings
from mapper_state.errors import BadInput, ExitCode, MapperStateError
from mapper_state.ops import commands as ops
from mapper_state.settings import Settings
from mapper_state.stores import open_configured_store
from mapper_state.stores.base import BlobStore


class NotConfirmed(MapperStateError):
    """A destructive command was not confirmed."""

    exit_code = ExitCode.CONFIG


def open_store(
    ctx: click.Context, flags: dict[str, Any], config_files: tuple[str, ...]
) -> tuple[Settings, BlobStore]:
    settings = command_settings(ctx, flags, config_files)
    store = open_configured_store(settings)
    ctx.call_on_close(store.close)  # the command's connections end with it
    return settings, store


def out(data: str | bytes) -> None:
    """Write to stdout; a reader that went away ends the command quietly."""
    try:
        if isinstance(data, str):
            data = data.encode()
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(ExitCode.DOWNSTREAM_CLOSED)


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise NotConfirmed("refused without confirmation: stdin is not a terminal; add --yes")
    if not click.confirm(question, default=False, err=True):
        raise NotConfirmed("cancelled; nothing was changed")


def read_input(arg: str | None) -> tuple[bytes, str]:
    if arg is None or arg == "-":
        if arg is None and sys.stdin.isatty():
            raise BadInput("give the state as an argument, or - to read it from stdin")
        return sys.stdin.buffer.read(), "the state on stdin"
    return arg.encode(), "the state given"


def parse_input(arg: str | None, meltano: bool) -> dict[str, Any]:
    data, where = read_input(arg)
    try:
        return ops.parse_state(data, meltano=meltano, where=where)
    except BadInput as exc:
        if arg not in (None, "-") and os.path.isfile(arg):
            raise BadInput(
                f"{exc.message} (to read the file {arg}, give - and `< {arg}`)"
            ) from None
        raise


def dump(value: Any, pretty: bool) -> bytes:
    return jsonio.dumps(value, indent=pretty) + b"\n"


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def ago(seconds: float) -> str:
    later, seconds = seconds < 0, abs(seconds)
    if seconds < 120:
        text = f"{seconds:.0f}s"
    elif seconds < 7200:
        text = f"{seconds / 60:.0f}m"
    else:
        text = f"{seconds / 3600:.1f}h"
    return f"in {text}" if later else f"{text} ago"


format_option = click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    help="text for people (default), json for scripts.",
)
meltano_option = click.option(
    "--meltano", is_flag=True, help='Meltano\'s {"singer_state": ...} shape.'
)
yes_option = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
