"""``mapper-state lock ...``: who holds a state ID's lease, and breaking it."""

from __future__ import annotations

import time

import click

from mapper_state import log
from mapper_state.cli import render
from mapper_state.cli.output import confirm, format_option, out, yes_option
from mapper_state.cli.params import STATE_ID
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.errors import ConfigError, ExitCode
from mapper_state.ops import commands as ops
from mapper_state.settings import URI_SETTING


@click.group("lock")
def lock_group() -> None:
    """Inspect or break the lease that keeps one run per state ID.

    \b
    Examples:
      mapper-state lock status dev:tap-x-to-target-y
      mapper-state lock break dev:tap-x-to-target-y --yes
    """


def _store(cx: StoreAccess) -> tuple[str, str]:
    """The store looked at, and where its URI came from (no secret in either)."""
    return cx.store.display_uri, cx.settings.origin(URI_SETTING)


@lock_group.command("status")
@click.argument("state_id", type=STATE_ID)
@format_option
@store_command(codes=(ExitCode.DOWNSTREAM_CLOSED,))
def lock_status(cx: StoreAccess, state_id: str, output_format: str) -> None:
    """Show who holds the lease on STATE_ID, or that it is free, and in which store.

    \b
    Example:
      mapper-state lock status dev:tap-x-to-target-y --format json
    """
    status, record = ops.lock_status(cx.store, state_id)
    uri, origin = _store(cx)
    if output_format == "json":
        out(render.dump(render.lock_status_doc(state_id, status, record, uri, origin), False))
        return
    out(render.lock_status_text(state_id, status, record, time.time(), f"{uri} (from {origin})"))


@lock_group.command("break")
@click.argument("state_id", type=STATE_ID)
@yes_option
@click.option(
    "--force",
    is_flag=True,
    help="Free the lease at once, for a holder known to be dead (no wait for it to stop).",
)
@store_command()
def lock_break(cx: StoreAccess, state_id: str, yes: bool, force: bool) -> None:
    """Break the lease on STATE_ID (asks first; --yes in scripts).

    Its holder is told to stop: it notices at its next look at the lease, stops its
    steps, and its state writes are refused (fencing). The lease becomes free for the
    next run once the holder has stopped, or at the latest at the holder's renewal
    deadline (the expiry it had), so two runs never overlap; --force frees it at once,
    for a holder known to be dead.

    \b
    Example:
      mapper-state lock break dev:tap-x-to-target-y --yes
    """
    store = cx.store
    where = ops.store_words(*_store(cx))
    status, record = ops.lock_status(store, state_id)
    if status == "free" or (status == "broken" and not force):
        already = (
            f"already broken; free once its holder has stopped, at the latest "
            f"{ops.format_time(record.free_from())}"
            if status == "broken" and record
            else "has no lease; nothing to break"
        )
        log.info(f"{state_id} in {where} {already}")
        return
    here = ops.holder_here(record) if record and status in ("held", "broken") else ""
    if force and here == ops.ALIVE and not yes:
        raise ConfigError(
            f"refusing --force: the holder of {state_id}, pid {record.pid if record else '?'}, "
            "is running on this host (stop it, or add --yes to break it anyway)"
        )
    confirm(_question(state_id, where, status, record, here, force), yes)
    # a holder whose pid no longer runs on its own host has stopped: nothing to wait for
    old = ops.break_lease(store, state_id, force=force or here == ops.GONE)
    log.info(_outcome(state_id, where, old, ops.read_lease(store, state_id)[0]))


def _question(
    state_id: str, where: str, status: str, record: ops.LeaseRecord | None, here: str, force: bool
) -> str:
    who = record.describe() if record else "an unreadable lease"
    warning = ""
    if here == ops.ALIVE and record:
        warning = f" Its pid {record.pid} is running on this host."
    elif here == ops.GONE and record:
        warning = f" Its pid {record.pid} is not running on this host."
    if status == "held":
        warning += (
            " It is still being renewed: it will be told to stop, and its state writes "
            "refused; "
            + (
                "--force frees the lease at once, so another run may overlap it."
                if force
                else "the next run may start once it has stopped."
            )
        )
    return f"Break the lease on {state_id} in {where}, {who}?{warning}"


def _outcome(
    state_id: str, where: str, old: ops.LeaseRecord | None, now: ops.LeaseRecord | None
) -> str:
    if old is None:
        return f"broke the lease on {state_id} in {where}; it is free now"
    holder = f"run {old.run_id} on host {old.host} (pid {old.pid})"
    if now is None or now.free_at is None:
        return (
            f"broke the lease on {state_id} in {where} of {holder}: free now; its next "
            "state write will be refused"
        )
    return (
        f"broke the lease on {state_id} in {where} of {holder}: it stops at its next look "
        f"at the lease (within {old.ttl_seconds / 3:.0f}s) and its state writes are refused; "
        f"the lease is free once it has stopped, at the latest {ops.format_time(now.free_from())}"
    )
