"""The operator commands' logic in one import, as plain functions over any :class:`BlobStore`.

The command line calls ``commands.<name>``; each concern lives in its own module:
:mod:`~mapper_state.ops.ids` (which state IDs may be named), :mod:`~mapper_state.ops.reading`
(listing and reading states and leases), :mod:`~mapper_state.ops.inputs` (parsing what the
user gives), :mod:`~mapper_state.ops.writes` (changes under the lease, with history) and
:mod:`~mapper_state.ops.transfer` (export and import), :mod:`~mapper_state.ops.history`
(the history a command shows); the lease's record and ``lock break`` come from the core
as they are. Every store inherits these commands
without a line of its own.
"""

from __future__ import annotations

from mapper_state.core.history import iso_time
from mapper_state.core.lease import LeaseRecord, break_lease, format_time, read_lease
from mapper_state.core.refusal import (
    ALIVE,
    GONE,
    busy,
    holder_here,
    not_running_note,
    store_words,
)
from mapper_state.ops.history import (
    HISTORY_ROOT,
    HistoryView,
    Snapshot,
    history_view,
    migrate_history,
)
from mapper_state.ops.ids import RESERVED_PREFIX, check_state_id, is_reserved
from mapper_state.ops.inputs import ImportEntry, parse_import, parse_state
from mapper_state.ops.reading import (
    LeaseStatus,
    get_state,
    list_state_ids,
    literal_prefix,
    lock_status,
    not_found,
    state_entries,
    state_keys,
)
from mapper_state.ops.transfer import export_line, export_meltano, export_states, import_states
from mapper_state.ops.writes import (
    StateExists,
    Transfer,
    Writer,
    WriteTerms,
    clear_many,
    clear_state,
    copy_state,
    merge_state,
    move_state,
    refuse_busy,
    rollback,
    set_state,
    write_with,
)

__all__ = [
    "ALIVE",
    "GONE",
    "HISTORY_ROOT",
    "RESERVED_PREFIX",
    "HistoryView",
    "ImportEntry",
    "LeaseRecord",
    "LeaseStatus",
    "Snapshot",
    "StateExists",
    "Transfer",
    "WriteTerms",
    "Writer",
    "break_lease",
    "busy",
    "check_state_id",
    "clear_many",
    "clear_state",
    "copy_state",
    "export_line",
    "export_meltano",
    "export_states",
    "format_time",
    "get_state",
    "history_view",
    "holder_here",
    "import_states",
    "is_reserved",
    "iso_time",
    "list_state_ids",
    "literal_prefix",
    "lock_status",
    "merge_state",
    "migrate_history",
    "move_state",
    "not_found",
    "not_running_note",
    "parse_import",
    "parse_state",
    "read_lease",
    "refuse_busy",
    "rollback",
    "set_state",
    "state_entries",
    "state_keys",
    "store_words",
    "write_with",
]
