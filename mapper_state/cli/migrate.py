"""``mapper-state state migrate``: move what older versions left to today's layout, once."""

from __future__ import annotations

from typing import Any

import click

from mapper_state.cli.common import handle_errors, store_options
from mapper_state.cli.output import open_store, out, plural
from mapper_state.cli.state import state_group
from mapper_state.core import history


@state_group.command("migrate")
@store_options
@click.pass_context
@handle_errors
def state_migrate(ctx: click.Context, /, **kw: Any) -> None:
    """Move history snapshots kept beside states (`<ID>/history/`, by older versions) to
    `.mapper-state/history/`, out of reach of `meltano state clear`. One listing finds them;
    running it again moves nothing. `meltano upgrade` does the same with the state backend.
    """
    _, store = open_store(ctx, kw["settings_flags"], kw["config_files"])
    moved = history.migrate_legacy(store)
    out(f"moved {plural(moved, 'snapshot')} to {history.HISTORY_ROOT}\n")
