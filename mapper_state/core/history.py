"""Per-run snapshots of a state, so that a bad run (or a bad manual edit) is one command to undo.

Each snapshot is one object under a reserved top-level prefix:
``.mapper-state/history/<state_id>/<UTC yyyymmddThhmmss.ffffffZ>-<run_id>.json``. It lives
outside ``<state_id>/`` because ``meltano state clear`` deletes that folder whole (on
the local store): the history survives it, so ``state rollback`` restores a state
Meltano cleared. No state ID starts with ``.mapper-state``, Meltano finds states only
by their ``state.json`` keys, and ``state list`` skips the reserved prefix without
listing it (:data:`HISTORY_ROOT`), so the history never costs a listing of states.

Earlier versions kept snapshots beside the state, in ``<state_id>/history/``. Those are
moved here once, by ``mapper-state state migrate`` (or ``meltano upgrade`` with the state
backend add-on: :func:`migrate_legacy`), and are not read before that: a run lists only
the new place, so the old one costs no request per run.

Names sort by time; only the newest ``keep`` snapshots are kept. A snapshot holds the
Singer state together with who wrote it:
``{"state_id", "time", "run_id", "host", "command", "note", "singer_state"}``
(``note`` says which operator command wrote it, empty for a pipeline run).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from mapper_state import jsonio, log, runtime
from mapper_state.core.lease import current_command
from mapper_state.core.state import RESERVED_PREFIX
from mapper_state.errors import BadInput, StateNotFound
from mapper_state.stores.base import BlobStore, PreconditionFailed, StoreError, listing

HISTORY_ROOT = ".mapper-state/history/"
"""Where every state ID's history lives; listing states excludes it."""
LEGACY_DIR = "history"
"""The folder beside ``state.json`` that held snapshots before :data:`HISTORY_ROOT`."""
_TIME_FORMAT = "%Y%m%dT%H%M%S.%fZ"
_NAME = re.compile(r"^(?P<time>\d{8}T\d{6}\.\d{6}Z)-(?P<run_id>[A-Za-z0-9_.-]{1,64})$")
UNRECORDED = "unrecorded"
"""Run ID of a snapshot taken of a state that some writer left without history."""


def history_prefix(state_id: str) -> str:
    return f"{HISTORY_ROOT}{state_id}/"


def legacy_prefix(state_id: str) -> str:
    return f"{state_id}/{LEGACY_DIR}/"


def snapshot_key(state_id: str, name: str) -> str:
    return f"{history_prefix(state_id)}{name}.json"


def legacy_key(state_id: str, name: str) -> str:
    return f"{legacy_prefix(state_id)}{name}.json"


def snapshot_time(name: str) -> datetime | None:
    """When the snapshot called ``name`` was taken (its name says), or ``None``."""
    match = _NAME.match(name)
    return _parse_time(match.group("time")) if match else None


def iso_time(when: datetime) -> str:
    """``2026-01-02T03:04:05.678901Z``: a snapshot's time (in UTC) as its document and the
    commands give it, ISO 8601 with ``Z`` for the zone."""
    return when.isoformat().replace("+00:00", "Z")


def names_in(keys: list[str], prefix: str) -> list[str]:
    """The snapshot names among ``keys`` directly under ``prefix``.

    Only direct children named like a snapshot count, so a nested state ID such as
    ``<state_id>/history`` is never mistaken for history.
    """
    names = []
    for key in keys:
        rest = key[len(prefix) :]
        if key.startswith(prefix) and rest.endswith(".json") and _NAME.match(rest[: -len(".json")]):
            names.append(rest[: -len(".json")])
    return names


@dataclass(frozen=True)
class Snapshot:
    """One kept state: its name (the key's file name without ``.json``) and what it records."""

    name: str
    time: datetime
    run_id: str
    host: str
    command: str
    note: str
    value: Any

    @property
    def written_by(self) -> str:
        return self.note or "run"


def _safe_run_id(run_id: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:64].strip(".")
    return cleaned or "run"


def _found(store: BlobStore, state_id: str) -> dict[str, str]:
    """``{snapshot name: key}``: one listing of the state's history."""
    prefix = history_prefix(state_id)
    return {
        name: snapshot_key(state_id, name) for name in names_in(list(store.list(prefix)), prefix)
    }


def _found_legacy(store: BlobStore, state_id: str) -> dict[str, str]:
    """``{snapshot name: key}`` of what an earlier version kept in ``<state_id>/history/``."""
    prefix = legacy_prefix(state_id)
    return {name: legacy_key(state_id, name) for name in names_in(list(store.list(prefix)), prefix)}


def snapshot_names(store: BlobStore, state_id: str) -> list[str]:
    """The names of the state's snapshots, oldest first."""
    return sorted(_found(store, state_id))


def _read_at(store: BlobStore, key: str, name: str) -> Snapshot | None:
    blob = store.read(key)
    if blob is None:
        return None
    try:
        doc = jsonio.loads(blob.data)
        value = doc["singer_state"]
    except (jsonio.DecodeError, KeyError, TypeError):
        return None
    match = _NAME.match(name)
    assert match is not None
    return Snapshot(
        name=name,
        time=_parse_time(match.group("time")),
        run_id=str(doc.get("run_id") or match.group("run_id")),
        host=str(doc.get("host") or ""),
        command=str(doc.get("command") or ""),
        note=str(doc.get("note") or ""),
        value=value,
    )


def read_snapshot(store: BlobStore, state_id: str, name: str) -> Snapshot | None:
    """The snapshot called ``name``, or ``None`` when it is gone or unreadable."""
    if not _NAME.match(name):
        return None
    return _read_at(store, snapshot_key(state_id, name), name)


def list_snapshots(store: BlobStore, state_id: str) -> list[Snapshot]:
    """Every readable snapshot of the state, oldest first."""
    found = _found(store, state_id)
    snapshots = (_read_at(store, found[name], name) for name in sorted(found))
    return [s for s in snapshots if s is not None]


def _migrate(store: BlobStore, state_id: str, found: dict[str, str]) -> None:
    """Move snapshots kept beside the state (where ``meltano state clear`` reaches) to the new place."""
    for name, key in sorted(found.items()):
        if key == snapshot_key(state_id, name):
            continue
        try:
            blob = store.read(key)
            if blob is None:  # gone meanwhile
                del found[name]
                continue
            with contextlib.suppress(PreconditionFailed):  # already moved
                store.create(snapshot_key(state_id, name), blob.data)
            store.delete(key)
        except StoreError as exc:
            log.warning(
                f"could not move snapshot {name} of {state_id} to {HISTORY_ROOT}: {exc.message}"
            )
            return
        found[name] = snapshot_key(state_id, name)


def migrate_legacy(store: BlobStore) -> int:
    """Move every snapshot older versions kept in ``<state_id>/history/`` to :data:`HISTORY_ROOT`.

    One listing of the store finds them all; returns how many were moved.
    """
    marker = f"/{LEGACY_DIR}/"
    by_state: dict[str, dict[str, str]] = {}
    for entry in listing(store, "", exclude=f"{RESERVED_PREFIX}/"):  # history, run records
        state_id, _, rest = entry.key.rpartition(marker)
        name = rest.removesuffix(".json")
        if state_id and rest.endswith(".json") and _NAME.match(name):
            by_state.setdefault(state_id, {})[name] = entry.key
    moved = 0
    for state_id, found in by_state.items():
        _migrate(store, state_id, found)
        moved += sum(key == snapshot_key(state_id, name) for name, key in found.items())
    return moved


def _parse_time(text: str) -> datetime:
    return datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=UTC)


def _next_time(names: list[str]) -> datetime:
    """Now, or just after the newest snapshot if clocks disagree, so names keep sorting by time."""
    now = datetime.fromtimestamp(runtime.now(), UTC)
    if names:
        newest = _parse_time(names[-1].split("-", 1)[0])
        if now <= newest:
            now = newest + timedelta(microseconds=1)
    return now


def write_snapshot(
    store: BlobStore,
    state_id: str,
    value: Any,
    *,
    run_id: str,
    keep: int,
    host: str,
    command: str,
    note: str = "",
) -> str | None:
    """Store ``value`` as the newest snapshot, prune to ``keep``; return its name."""
    if keep <= 0:
        return None
    found = _found(store, state_id)
    names = sorted(found)
    run_id = _safe_run_id(run_id)
    for _ in range(5):
        when = _next_time(names)
        name = f"{when.strftime(_TIME_FORMAT)}-{run_id}"
        doc = {
            "state_id": state_id,
            "time": iso_time(when),
            "run_id": run_id,
            "host": host,
            "command": command,
            "note": note,
            "singer_state": value,
        }
        try:
            store.create(snapshot_key(state_id, name), jsonio.dumps(doc))
            break
        except PreconditionFailed:  # the same name in the same microsecond: take the next one
            names = sorted([*names, name])
    else:
        raise StoreError(f"could not record a history snapshot of {state_id}")
    found[name] = snapshot_key(state_id, name)
    prune(store, state_id, keep, found)
    return name


def record(
    store: BlobStore,
    state_id: str,
    value: Any,
    *,
    run_id: str,
    keep: int,
    note: str = "",
    command: str | None = None,
    host: str | None = None,
) -> None:
    """Keep ``value`` as the snapshot of run ``run_id``, after that run's final commit.

    ``note`` names the operator command that wrote the state; runs leave it empty.
    ``command`` is the writer's command line as its lease keeps it (secrets hidden);
    ``host`` is this machine's name unless given.
    """
    write_snapshot(
        store,
        state_id,
        value,
        run_id=run_id,
        keep=keep,
        host=runtime.host() if host is None else host,
        command=current_command() if command is None else command,
        note=note,
    )


def record_if_missing(
    store: BlobStore,
    state_id: str,
    value: Any,
    *,
    keep: int,
    run_id: str = UNRECORDED,
    note: str = "another writer",
    command: str | None = None,
) -> bool:
    """Snapshot a state if the newest snapshot does not hold it; return whether it did.

    States written by Meltano, by a ``lock_only`` run or before history existed have
    no snapshot; taking one before an operator command changes them keeps every
    change undoable (and a Meltano run's lease keeper takes one of the state Meltano
    wrote, with that run's ID).
    """
    if value is None or keep <= 0:
        return False
    names = snapshot_names(store, state_id)
    newest = read_snapshot(store, state_id, names[-1]) if names else None
    if newest is not None and newest.value == value:
        return False
    host = None if run_id != UNRECORDED else ""  # a writer we do not know: no host either
    record(store, state_id, value, run_id=run_id, keep=keep, note=note, command=command, host=host)
    return True


def prune(store: BlobStore, state_id: str, keep: int, found: dict[str, str] | None = None) -> None:
    """Delete all but the newest ``keep`` snapshots (``found``: name to key, if known)."""
    found = _found(store, state_id) if found is None else found
    names = sorted(found)
    for name in names[: max(0, len(names) - keep)]:
        store.delete(found[name])


def delete_all(store: BlobStore, state_id: str) -> int:
    """Remove every snapshot of the state, those an earlier version kept beside it too (so
    that a later ``state migrate`` brings none back); return how many there were."""
    keys = [*_found(store, state_id).values(), *_found_legacy(store, state_id).values()]
    for key in keys:
        store.delete(key)
    return len(keys)


def find(snapshots: list[Snapshot], ref: str) -> list[Snapshot]:
    """The snapshot named ``ref``, else every snapshot whose name starts with ``ref``."""
    ref = ref.removesuffix(".json")
    exact = [s for s in snapshots if s.name == ref]
    return exact or [s for s in snapshots if s.name.startswith(ref)]


# -- what changed ------------------------------------------------------------------


def find_one(snapshots: list[Snapshot], ref: str, state_id: str) -> Snapshot:
    """The one snapshot ``ref`` names; a clear error when it names none, or several."""
    matches = find(snapshots, ref)
    if not matches:
        raise StateNotFound(
            f"no snapshot {ref} in the history of {state_id} "
            f"(`mapper-state state history {state_id}` lists them)"
        )
    if len(matches) > 1:
        names = ", ".join(s.name for s in matches[:5])
        raise BadInput(f"snapshot {ref} is ambiguous: it matches {names}")
    return matches[0]
