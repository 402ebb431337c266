"""What the operator commands share besides the store: their options, stdout, prompts, input.

Human-friendly output by default, ``--format json`` for scripts; messages go to
stderr (through :mod:`mapper_state.log`) so that stdout holds only what was asked for.
What is printed is built in :mod:`mapper_state.cli.render`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from mapper_state.errors import BadInput, ExitCode, MapperStateError
from mapper_state.ops import commands as ops


class NotConfirmed(MapperStateError):
    """A destructive command was not confirmed."""

    exit_code = ExitCode.CONFIG


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
        # the question says what a script is about to do (a live holder on this host...)
        raise NotConfirmed(
            f"refused without confirmation (stdin is not a terminal; add --yes): {question}"
        )
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
stream_option = click.option(
    "--stream",
    "stream",
    metavar="STREAM",
    help="Only the bookmark of STREAM (bookmarks.STREAM).",
)
