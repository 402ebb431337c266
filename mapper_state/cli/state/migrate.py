"""``state migrate``: move what older versions left to today's layout, once."""

from __future__ import annotations

import click

from mapper_state.cli.output import out
from mapper_state.cli.render import plural
from mapper_state.cli.store import StoreAccess, store_command
from mapper_state.ops import commands as ops


@click.command("migrate")
@store_command()
def state_migrate(cx: StoreAccess) -> None:
    """Move history snapshots kept beside states (`<ID>/history/`, by older versions) to
    `.mapper-state/history/`, out of reach of `meltano state clear`. One listing finds them;
    running it again moves nothing. `meltano upgrade` does the same with the state backend.

    \b
    Examples:
      mapper-state state migrate
      mapper-state state migrate --state-backend-uri s3://bucket/prefix
    """
    moved = ops.migrate_history(cx.store)
    out(f"{cx.store.display_uri}: moved {plural(moved, 'snapshot')} to {ops.HISTORY_ROOT}\n")
