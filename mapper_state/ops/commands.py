"""The operator commands' logic, as plain functions over any :class:`BlobStore`.

Every write goes through the same path as a run: take the lease on the state ID,
read the state and its version, confirm the lease, then write only if the state is
still at that version. So an operator can never interleave with a running
pipeline, and every store inherits these commands without a line of its own.
Before a state is changed or cleared its current value is kept in the history
(if the newest snapshot does not already hold it), so every change is undoable
with ``state rollback``.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Protocol

from mapper_state import jsonio, log
from mapper_state.core import history, state
from mapper_state.core.deletes import delete_held
from mapper_state.core.lease import Lease, LeaseRecord, read_lease
from mapper_state.core.state import StateSnapshot, state_key, validate_state_id
from mapper_state.errors import (
    BadInput,
    InvalidStateId,
    LeaseBusy,
    LeaseLost,
    MapperStateError,
    StateNotFound,
)
from mapper_state.ops.fetch import fetch_all
from mapper_state.settings import Settings
from mapper_state.stores.base import BlobStore, Entry, PreconditionFailed, StoreError, listing

RESERVED_PREFIX = ".mapper-state"
"""State IDs whose first segment starts with this are reserved (``doctor``'s scratch keys)."""


class StateExists(BadInput):
    """A copy, move or import would overwrite a state without ``--force``."""


@dataclass(frozen=True)
class Guard:
    """How a write takes the lease, and how much history it keeps."""

    ttl: float
    retry: float
    wait: float
    history_keep: int
    #: Secret values in force, hidden from the command line the lease and history keep.
    secret_values: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> Guard:
        return cls(
            ttl=settings.lock_timeout,
            retry=settings.lock_retry,
            wait=settings.lock_wait,
            history_keep=settings["history_keep"],
            secret_values=tuple(settings.secrets()),
        )

    def secrets(self) -> list[str]:
        return list(self.secret_values)

    @property
    def lock_timeout(self) -> float:
        return self.ttl

    @property
    def lock_retry(self) -> float:
        return self.retry

    @property
    def lock_wait(self) -> float:
        return self.wait

    def lease(self, store: BlobStore, state_id: str) -> Lease:
        return Lease.for_settings(store, state_id, self)


def is_reserved(state_id: str) -> bool:
    return state_id.split("/", 1)[0].startswith(RESERVED_PREFIX)


def check_state_id(state_id: str | None) -> str:
    """:func:`validate_state_id`, and refuse the names mapper-state keeps for itself."""
    state_id = validate_state_id(state_id)
    if is_reserved(state_id):
        raise InvalidStateId(f"state IDs starting with {RESERVED_PREFIX} are reserved")
    return state_id


# -- reading -----------------------------------------------------------------------


def literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard: where a listing for it starts."""
    match = re.search(r"[*?\[]", pattern)
    return pattern[: match.start()] if match else pattern


def state_keys(store: BlobStore, pattern: str | None = None) -> Iterator[Entry]:
    """The listing that finds states: everything under the pattern's literal prefix but the
    history (:data:`history.HISTORY_ROOT`), which the store skips without paging through it."""
    prefix = literal_prefix(pattern) if pattern else ""
    return listing(store, prefix, exclude=history.HISTORY_ROOT)


def list_state_ids(store: BlobStore, pattern: str | None = None) -> list[str]:
    """State IDs in the store (keys ending in ``/state.json``), sorted, matching ``pattern``."""
    return sorted(state_entries(store, pattern))


def state_entries(
    store: BlobStore, pattern: str | None = None, entries: Iterable[Entry] | None = None
) -> dict[str, Entry]:
    """``{state ID: its state.json's listing entry}`` for the states matching ``pattern``.

    ``entries`` is :func:`state_keys`'s listing when the caller has it already.
    """
    suffix = "/" + state.STATE_FILE
    found = {}
    for entry in state_keys(store, pattern) if entries is None else entries:
        key = entry.key
        if not key.endswith(suffix):
            continue
        state_id = key[: -len(suffix)]
        if is_reserved(state_id) or (pattern and not fnmatch.fnmatchcase(state_id, pattern)):
            continue
        found[state_id] = entry
    return found


def not_found(store: BlobStore, state_id: str) -> StateNotFound:
    return StateNotFound(
        f"state ID {state_id} not found in {store.display_uri} (`mapper-state state list` shows them)"
    )


def get_state(store: BlobStore, state_id: str) -> Any:
    """The Singer state of ``state_id`` (``{}`` for a document without one)."""
    snapshot = state.load(store, state_id)
    if not snapshot.exists:
        raise not_found(store, state_id)
    return {} if snapshot.value is None else snapshot.value


def parse_state(data: bytes, *, meltano: bool, where: str) -> dict[str, Any]:
    """A Singer state given by the user, bare or (``meltano``) as ``{"singer_state": ...}``."""
    try:
        doc = jsonio.loads(data)
    except jsonio.DecodeError as exc:
        raise BadInput(f"{where} is not valid JSON ({exc}); nothing was changed") from None
    if meltano:
        if not isinstance(doc, dict) or set(doc) != {"singer_state"}:
            raise BadInput(
                f'{where} must have Meltano\'s shape {{"singer_state": {{...}}}} (--meltano); '
                "nothing was changed"
            )
        doc = doc["singer_state"]
    elif isinstance(doc, dict) and set(doc) == {"singer_state"}:
        raise BadInput(
            f'{where} looks like Meltano\'s {{"singer_state": ...}} shape; add --meltano to '
            "read it that way; nothing was changed"
        )
    if not isinstance(doc, dict):
        raise BadInput(f"{where} must be a JSON object (a Singer state); nothing was changed")
    return doc


def lock_status(store: BlobStore, state_id: str) -> tuple[str, LeaseRecord | None]:
    """``("free" | "held" | "expired" | "unreadable", record)`` for the state ID's lease."""
    record, blob = read_lease(store, state_id)
    if blob is None:
        return "free", None
    if record is None:
        return "unreadable", None
    if not record.held:  # released or broken: a free lease, left as a record
        return "free", None
    return ("expired" if record.is_expired(time.time()) else "held"), record


# -- writing under the lease --------------------------------------------------------


def _keep_current(
    store: BlobStore, snapshot: StateSnapshot, guard: Guard, command: str | None = None
) -> None:
    """Snapshot the state about to change; if that fails, change nothing."""
    try:
        history.record_if_missing(
            store, snapshot.state_id, snapshot.value, keep=guard.history_keep, command=command
        )
    except StoreError as exc:
        raise StoreError(
            f"could not keep the current state of {snapshot.state_id} in its history, "
            f"so nothing was changed: {exc.message}"
        ) from None


def _commit(
    store: BlobStore, lease: Lease, snapshot: StateSnapshot, value: Any, guard: Guard, note: str
) -> None:
    _keep_current(store, snapshot, guard, lease.command)
    lease.confirm()
    state.save(
        store,
        snapshot.state_id,
        value,
        if_version=snapshot.version,
        serial=snapshot.next_serial,
        run_id=lease.run_id,
    )
    try:
        history.record(
            store,
            snapshot.state_id,
            value,
            run_id=lease.run_id,
            keep=guard.history_keep,
            note=note,
            command=lease.command,
        )
    except StoreError as exc:
        log.warning(
            f"the state of {snapshot.state_id} was written, but not its history snapshot: "
            f"{exc.message}"
        )


def _remove(
    store: BlobStore, lease: Lease, snapshot: StateSnapshot, guard: Guard, *, keep_history: bool
) -> None:
    if keep_history:
        _keep_current(store, snapshot, guard, lease.command)
    lease.confirm()
    try:
        delete_held(store, state_key(snapshot.state_id), snapshot.version)
    except PreconditionFailed:
        raise LeaseLost(
            f"the state of {snapshot.state_id} was changed by another writer; not clearing it"
        ) from None


def write_with(
    store: BlobStore,
    state_id: str,
    guard: Guard,
    compute: Callable[[StateSnapshot], Any],
    note: str,
) -> Any:
    """Under the lease: read the state, ``compute`` the new one from it, write it (with
    history snapshots before and after); return what was written."""
    with guard.lease(store, state_id) as lease:
        snapshot = state.load(store, state_id)
        value = compute(snapshot)
        _commit(store, lease, snapshot, value, guard, note)
    return value


#: ``set_state`` or ``merge_state``: ``(store, state_id, value, guard)``.
Writer = Callable[[BlobStore, str, Any, Guard], Any]


#: ``copy_state`` or ``move_state``: ``(store, src, dst, guard, *, force)``.
class Transfer(Protocol):
    def __call__(
        self, store: BlobStore, src: str, dst: str, guard: Guard, *, force: bool
    ) -> None: ...


def set_state(store: BlobStore, state_id: str, value: Any, guard: Guard) -> None:
    write_with(store, state_id, guard, lambda _: value, "state set")


def merge_state(store: BlobStore, state_id: str, value: Any, guard: Guard) -> Any:
    """Deep-merge ``value`` over the existing state; return the result."""

    def merged(snapshot: StateSnapshot) -> Any:
        if not snapshot.exists:
            raise not_found(store, state_id)
        return state.deep_merge(snapshot.value or {}, value)

    return write_with(store, state_id, guard, merged, "state merge")


def clear_state(store: BlobStore, state_id: str, guard: Guard, *, with_history: bool) -> str | None:
    """Remove the state, and its history if ``with_history``.

    Returns the newest snapshot's name (the one that restores the state), if any.
    """
    with guard.lease(store, state_id) as lease:
        snapshot = state.load(store, state_id)
        if snapshot.exists:
            _remove(store, lease, snapshot, guard, keep_history=not with_history)
        elif not (with_history and history.snapshot_names(store, state_id)):
            raise not_found(store, state_id)
        if with_history:
            history.delete_all(store, state_id)
            return None
        names = history.snapshot_names(store, state_id)
        return names[-1] if names else None


def refuse_busy(store: BlobStore, state_ids: list[str], what: str) -> None:
    """Fail before touching anything if any of ``state_ids`` is held by a live run."""
    now = time.time()
    for state_id, (holder, _) in fetch_all(state_ids, lambda i: read_lease(store, i)):
        if holder is not None and not holder.is_expired(now):
            raise LeaseBusy(f"{what}: state ID {state_id} is busy: {holder.describe()}")


def _each(state_ids: list[str], action: Callable[[str], object], verb: str) -> None:
    for done, state_id in enumerate(state_ids):
        try:
            action(state_id)
        except MapperStateError as exc:
            raise MapperStateError(
                f"{verb} {done} of {len(state_ids)} states, then stopped at {state_id}: "
                f"{exc.message}",
                exit_code=exc.exit_code,
            ) from None


def clear_many(store: BlobStore, state_ids: list[str], guard: Guard, *, with_history: bool) -> None:
    refuse_busy(store, state_ids, "nothing cleared")
    _each(
        state_ids,
        lambda i: clear_state(store, i, guard, with_history=with_history),
        "cleared",
    )


def _refuse_existing(snapshot: StateSnapshot, force: bool) -> None:
    if snapshot.exists and not force:
        raise StateExists(f"state ID {snapshot.state_id} exists already; add --force to replace it")


def copy_state(store: BlobStore, src: str, dst: str, guard: Guard, *, force: bool) -> None:
    if src == dst:
        raise BadInput("the source and destination are the same state ID")
    source = state.load(store, src)
    if not source.exists:
        raise not_found(store, src)

    def value(target: StateSnapshot) -> Any:
        _refuse_existing(target, force)
        return source.value

    write_with(store, dst, guard, value, f"state copy from {src}")


def move_state(store: BlobStore, src: str, dst: str, guard: Guard, *, force: bool) -> None:
    """Copy ``src`` onto ``dst`` and remove ``src``, holding both leases (taken in name order)."""
    if src == dst:
        raise BadInput("the source and destination are the same state ID")
    with ExitStack() as stack:
        leases = {i: stack.enter_context(guard.lease(store, i)) for i in sorted((src, dst))}
        source = state.load(store, src)
        if not source.exists:
            raise not_found(store, src)
        target = state.load(store, dst)
        _refuse_existing(target, force)
        _commit(store, leases[dst], target, source.value, guard, f"state move from {src}")
        try:
            _remove(store, leases[src], source, guard, keep_history=True)
        except MapperStateError as exc:
            raise MapperStateError(
                f"copied {src} to {dst} ({dst} holds the state now) but could not remove "
                f"{src}, which still holds it too: {exc.message}; run `mapper-state state "
                f"clear {src}` once the store allows",
                exit_code=exc.exit_code,
            ) from None


def rollback(
    store: BlobStore, state_id: str, ref: str, guard: Guard
) -> tuple[history.Snapshot, bool]:
    """Restore the snapshot ``ref`` names; return it and whether anything changed."""
    with guard.lease(store, state_id) as lease:
        snapshots = history.list_snapshots(store, state_id)
        if not snapshots:
            raise StateNotFound(f"state ID {state_id} has no history in {store.display_uri}")
        target = history.find_one(snapshots, ref, state_id)
        current = state.load(store, state_id)
        if current.exists and current.value == target.value:
            return target, False
        _commit(store, lease, current, target.value, guard, f"state rollback to {target.name}")
        return target, True


# -- export and import --------------------------------------------------------------


def export_states(store: BlobStore, pattern: str | None = None) -> Iterator[tuple[str, Any]]:
    """``(state_id, singer_state)`` for every state, in state ID order (read concurrently)."""
    loaded = fetch_all(list_state_ids(store, pattern), lambda i: state.load(store, i))
    for state_id, snapshot in loaded:
        if snapshot.exists:
            yield state_id, {} if snapshot.value is None else snapshot.value


def export_line(state_id: str, value: Any) -> bytes:
    """One line of ``state export``: ``{"state_id": ..., "singer_state": ...}``."""
    return jsonio.dumps({"state_id": state_id, "singer_state": value}) + b"\n"


@dataclass(frozen=True)
class ImportEntry:
    line: int
    state_id: str
    value: dict[str, Any]


def _meltano_export(doc: Any) -> bool:
    """Whether ``doc`` is what ``meltano state export`` prints: ``{id: {completed, partial}}``."""
    return (
        isinstance(doc, dict)
        and bool(doc)
        and not {"state_id", "singer_state"} & set(doc)
        and all(
            isinstance(v, dict) and v and set(v) <= {"completed", "partial"} for v in doc.values()
        )
    )


def _from_meltano_export(doc: dict[str, Any]) -> list[tuple[int, Any]]:
    docs: list[tuple[int, Any]] = []
    for state_id, entry in doc.items():
        try:
            value = state.singer_state(entry)
        except ValueError:
            value = None
        if value is None:
            log.warning(f"skipping {state_id}: Meltano's export holds no state for it")
            continue
        docs.append((1, {"state_id": state_id, "singer_state": value}))
    return docs


def _entry(line: int, doc: Any, default_id: str | None) -> ImportEntry:
    where = f"line {line}"
    if not isinstance(doc, dict):
        raise BadInput(f"{where}: expected a JSON object with state_id and singer_state")
    if "singer_state" not in doc:
        hint = " ({} is what `meltano state get` prints for an ID without state)" if not doc else ""
        raise BadInput(f"{where}: no singer_state{hint}")
    value = doc["singer_state"]
    if not isinstance(value, dict):
        raise BadInput(f"{where}: singer_state must be a JSON object")
    state_id = doc.get("state_id")
    if state_id is None:
        if default_id is None:
            raise BadInput(
                f"{where}: no state_id; name it with --state-id ID "
                "(as when importing what `meltano state get ID` prints)"
            )
        state_id = default_id
    elif default_id is not None and state_id != default_id:
        raise BadInput(f"{where}: names state ID {state_id} but --state-id says {default_id}")
    if not isinstance(state_id, str):
        raise BadInput(f"{where}: state_id must be a string")
    try:
        check_state_id(state_id)
    except InvalidStateId as exc:
        raise BadInput(f"{where}: {exc.message}") from None
    return ImportEntry(line, state_id, value)


def parse_import(data: bytes, *, state_id: str | None = None) -> list[ImportEntry]:
    """Validate a whole import before anything is written.

    Accepts ``state export``'s JSON lines, what ``meltano state get ID`` prints
    (``{"singer_state": ...}``, with ``state_id``), and ``meltano state export``'s
    single object. Raises :class:`BadInput` naming the first bad line.
    """
    if not data.strip():
        return []
    docs: list[tuple[int, Any]]
    try:
        whole = jsonio.loads(data)  # one document, possibly pretty-printed
        docs = _from_meltano_export(whole) if _meltano_export(whole) else [(1, whole)]
    except jsonio.DecodeError:
        docs = []
        for number, line in enumerate(data.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                docs.append((number, jsonio.loads(line)))
            except jsonio.DecodeError as exc:
                raise BadInput(
                    f"line {number} is not valid JSON ({exc}); nothing imported"
                ) from None
    entries = []
    first_line: dict[str, int] = {}
    for number, doc in docs:
        try:
            entry = _entry(number, doc, state_id)
        except BadInput as exc:
            raise BadInput(f"{exc.message}; nothing imported") from None
        if entry.state_id in first_line:
            raise BadInput(
                f"line {number}: state ID {entry.state_id} appears twice "
                f"(first on line {first_line[entry.state_id]}); nothing imported"
            )
        first_line[entry.state_id] = number
        entries.append(entry)
    return entries


def import_states(
    store: BlobStore, entries: list[ImportEntry], guard: Guard, *, force: bool
) -> None:
    """Write every entry, each under its lease; refuse up front if any exists or is busy."""
    if not force:
        loaded = fetch_all([e.state_id for e in entries], lambda i: state.load(store, i))
        existing = [state_id for state_id, snapshot in loaded if snapshot.exists]
        if existing:
            shown = ", ".join(existing[:5]) + (" ..." if len(existing) > 5 else "")
            raise StateExists(
                f"nothing imported: {len(existing)} of these states exist already ({shown}); "
                "add --force to replace them"
            )
    refuse_busy(store, [e.state_id for e in entries], "nothing imported")
    values = {e.state_id: e.value for e in entries}

    def write(state_id: str) -> None:
        def value(target: StateSnapshot) -> Any:
            _refuse_existing(target, force)
            return values[state_id]

        write_with(store, state_id, guard, value, "state import")

    _each(list(values), write, "imported")
