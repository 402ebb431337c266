"""``mapper-state state ...``: read, change, back up and restore states.

One module per command (or pair of twin commands); each is its arguments and a call
into :mod:`mapper_state.ops`, declared with :func:`mapper_state.cli.store.store_command`.
"""

from __future__ import annotations

import click

from mapper_state.cli.state import (
    backup,
    clear,
    diff,
    get,
    history,
    listing,
    migrate,
    transfer,
    write,
)


@click.group("state")
def state_group() -> None:
    """Read, change, back up and restore the states in the store.

    Every write takes the state ID's lease, like a run, so it never interleaves
    with a running pipeline (a busy lease fails with exit code 3). Every write
    also keeps a snapshot in the state's history: `state history ID` lists
    them and `state rollback ID --to SNAPSHOT` undoes a bad run or a mistake,
    even after `state clear` (history is only removed by `clear --history`).

    \b
    Examples:
      mapper-state state list --long
      mapper-state state get dev:tap-x-to-target-y
      mapper-state state history dev:tap-x-to-target-y
      mapper-state state rollback dev:tap-x-to-target-y --to 2024-06-01T10
    """


for _command in (
    listing.state_list,
    get.state_get,
    write.state_set,
    write.state_merge,
    clear.state_clear,
    transfer.state_copy,
    transfer.state_move,
    backup.state_export,
    backup.state_import,
    history.state_history,
    diff.state_diff,
    history.state_rollback,
    migrate.state_migrate,
):
    state_group.add_command(_command)
