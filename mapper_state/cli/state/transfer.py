"""``state copy`` and ``state move``: SRC onto DST, under the lease."""

from __future__ import annotations

from collections.abc import Callable

import click

from mapper_state import log
from mapper_state.cli.params import STATE_ID
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import ExitCode
from mapper_state.ops import commands as ops

_CODES = (ExitCode.BAD_INPUT, ExitCode.NOT_FOUND)


def _transfer_arguments(body: Callable[..., None]) -> Callable[..., None]:
    """SRC, DST and ``--force``, under the lease: what ``copy`` and ``move`` both take."""
    for decorate in reversed(
        (
            click.argument("src", type=STATE_ID),
            click.argument("dst", type=STATE_ID),
            click.option("--force", is_flag=True, help="Replace DST if it exists."),
            store_command(lease=True, codes=_CODES),
        )
    ):
        body = decorate(body)
    return body


@click.command("copy")
@_transfer_arguments
def state_copy(cx: StoreAccess, src: str, dst: str, force: bool) -> None:
    """Copy the state of SRC to DST (DST under the lease).

    DST must not exist, unless --force is given (exit 6 otherwise).

    \b
    Example:
      mapper-state state copy prod:tap-x-to-target-y dev:tap-x-to-target-y --force
    """
    ops.copy_state(cx.store, src, dst, cx.terms, force=force)
    log.info(f"copied the state of {src} to {dst}")


@click.command("move")
@_transfer_arguments
def state_move(cx: StoreAccess, src: str, dst: str, force: bool) -> None:
    """Move the state of SRC to DST, holding both leases.

    DST must not exist, unless --force is given (exit 6 otherwise).

    \b
    Example:
      mapper-state state move dev:tap-x-to-target-y dev:tap-x-to-target-z
    """
    ops.move_state(cx.store, src, dst, cx.terms, force=force)
    log.info(f"moved the state of {src} to {dst}")
