"""How a lease is named to an operator: in which store, and whether its holder still runs.

A refusal ("state ID X is busy: held by run ... on host vm (pid 825)") is acted on by a
person: they must know which store was looked at (a command run outside its project
looks at the default store, where nobody holds anything) and whether the holder they
would wait for is still alive. A holder on this very host whose pid is not running is a
crashed run: its lease only waits for its TTL, or for `lock break`.
"""

from __future__ import annotations

import contextlib
import os

from mapper_state import runtime
from mapper_state.core.lease import LeaseRecord, read_lease
from mapper_state.errors import LeaseBusy
from mapper_state.stores.base import BlobStore, StoreError

#: What a refused run can do, in every refusal of a run (``run``, the filter, ``exec``).
RETRY_HINT = (
    "retry when it has finished, set lock_wait_seconds (--lock-wait-seconds) to wait for it, "
    "or `mapper-state lock break` a holder known to be dead"
)

ALIVE, GONE, ELSEWHERE = "alive", "gone", "elsewhere"


def pid_running(pid: int) -> bool:
    """Is process ``pid`` running on this host (a zombie is not)?"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        if not os.path.isdir("/proc"):  # no /proc: ask the kernel
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return False


def holder_here(record: LeaseRecord) -> str:
    """:data:`ALIVE` or :data:`GONE` for a holder on this host, :data:`ELSEWHERE` otherwise."""
    if record.host != runtime.host():
        return ELSEWHERE
    return ALIVE if pid_running(record.pid) else GONE


def not_running_note(record: LeaseRecord | None) -> str:
    """``pid 825 is not running on host vm: `lock break` it`` for a holder that is gone here."""
    if record is None or not record.held or holder_here(record) != GONE:
        return ""
    return f"pid {record.pid} is not running on host {record.host}: `mapper-state lock break` it"


def store_words(display_uri: str, origin: str) -> str:
    """``store s3://b/p (from meltano.yml)``: the store, and where its URI came from."""
    return f"store {display_uri} (from {origin})" if origin else f"store {display_uri}"


def busy(exc: LeaseBusy, store: BlobStore, state_id: str, origin: str, hint: str) -> LeaseBusy:
    """A refusal saying the store, whether the holder still runs here, and what to do."""
    note = ""
    if state_id:
        with contextlib.suppress(StoreError):
            note = not_running_note(read_lease(store, state_id)[0])
    parts = [store_words(store.display_uri, origin), note, hint]
    return LeaseBusy(f"{exc.message} ({'; '.join(p for p in parts if p)})")
