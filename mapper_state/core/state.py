"""The state document in Meltano's layout, its version-checked load and save, and merging.

A state ID's state lives at ``<state_id>/state.json`` as
``{"completed": {"singer_state": <value>}, "partial": {}}``, exactly what Meltano's
own backends write, so either tool reads what the other wrote. The two halves are
Meltano's: a state written by Meltano as partial stays in ``partial``, keys other than
``singer_state`` (``meltano state set --no-validate``) stay where they were written, and
an empty state stays ``{"completed": {}, "partial": {}}``
(:attr:`StateSnapshot.document`). mapper-state's own readers see the effective Singer
state, ``partial`` merged over ``completed`` (:func:`singer_state`), and its own
writers write the whole state as ``completed``.

Beside Meltano's two keys every write of ours adds ``"mapper_state": {"serial": N,
"run_id": ..., "written_at": ...}`` (Meltano ignores it when it reads). It makes the
bytes of every write unique, so that a compare-and-swap is sound on S3, whose
versions (ETags) are content hashes: rewriting the same state still changes its
version, and a write conditional on the old version fails.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from mapper_state import jsonio
from mapper_state.errors import InvalidStateId, LeaseLost
from mapper_state.stores.base import BlobStore, PreconditionFailed, StoreError

STATE_FILE = "state.json"
WRITER_KEY = "mapper_state"
MAX_STATE_ID_LENGTH = 512
MAX_SEGMENT_BYTES = 255  # a file name's limit on common file systems
RESERVED_PREFIX = ".mapper-state"  # doctor's scratch objects live under such names
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")


def validate_state_id(state_id: str | None) -> str:
    """Return ``state_id`` if it is safe as a key on every store, else raise a clear error."""
    if state_id is None or not str(state_id).strip():
        raise InvalidStateId("state_id is required (--state-id or the state_id setting)")
    shown = repr(state_id) if len(state_id) <= 80 else repr(state_id[:80] + "...")
    if len(state_id) > MAX_STATE_ID_LENGTH:
        raise InvalidStateId(f"state ID {shown} is longer than {MAX_STATE_ID_LENGTH} characters")
    if _CONTROL.search(state_id):
        raise InvalidStateId(f"state ID {shown} contains a control character or backslash")
    if state_id.startswith("/") or state_id.endswith("/"):
        raise InvalidStateId(f"state ID {shown} must not start or end with '/'")
    if any(part in ("", ".", "..") for part in state_id.split("/")):
        raise InvalidStateId(f"state ID {shown} contains an empty, '.' or '..' path segment")
    if any(len(part.encode()) > MAX_SEGMENT_BYTES for part in state_id.split("/")):
        raise InvalidStateId(
            f"state ID {shown} has a part between '/' longer than {MAX_SEGMENT_BYTES} bytes "
            "(too long for a file name)"
        )
    if state_id != state_id.strip():
        raise InvalidStateId(f"state ID {shown} has leading or trailing spaces")
    if state_id.startswith(RESERVED_PREFIX):
        raise InvalidStateId(f"state IDs starting with {RESERVED_PREFIX} are reserved")
    return state_id


def state_key(state_id: str) -> str:
    return f"{state_id}/{STATE_FILE}"


@dataclass(frozen=True)
class Writer:
    """Who wrote a state document, as its ``mapper_state`` key records (absent: Meltano)."""

    serial: int = 0
    run_id: str | None = None
    written_at: float | None = None

    @classmethod
    def of(cls, doc: Any) -> Writer:
        raw = doc.get(WRITER_KEY) if isinstance(doc, dict) else None
        if not isinstance(raw, dict):
            return cls()
        try:
            serial = int(raw.get("serial") or 0)
            written_at = raw.get("written_at")
            return cls(
                serial=serial,
                run_id=str(raw["run_id"]) if raw.get("run_id") else None,
                written_at=float(written_at) if written_at is not None else None,
            )
        except (TypeError, ValueError):
            return cls()


@dataclass(frozen=True)
class StateSnapshot:
    """A state as read: the Singer state value (``None`` when there is none) and its version."""

    state_id: str
    value: Any
    version: str | None
    writer: Writer = Writer()
    #: Meltano's two halves as stored, ``{"completed": ..., "partial": ...}`` (``None``
    #: when there is no state); the writer's record is not part of it.
    document: dict[str, Any] | None = None

    @property
    def exists(self) -> bool:
        return self.version is not None

    @property
    def next_serial(self) -> int:
        return self.writer.serial + 1


def meltano_document(value: Any) -> dict[str, Any]:
    """Meltano's document for a Singer state value: ``{"completed": {"singer_state": ...}, ...}``."""
    return {"completed": {"singer_state": value}, "partial": {}}


def singer_state(doc: Any) -> Any:
    """The effective Singer state in a Meltano document: ``partial`` merged over ``completed``.

    Raises ``ValueError`` when ``doc`` is not such a document.
    """
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    completed = doc.get("completed") or {}
    partial = doc.get("partial") or {}
    if not isinstance(completed, dict) or not isinstance(partial, dict):
        raise ValueError("completed and partial must be objects")
    value = completed.get("singer_state")
    if "singer_state" in partial:
        value = deep_merge(value, partial["singer_state"])
    return value


def halves(doc: dict[str, Any]) -> dict[str, Any]:
    """Meltano's part of a stored document: every key but the writer's record."""
    return {k: v for k, v in doc.items() if k != WRITER_KEY}


def encode_document(
    value: Any, *, serial: int = 1, run_id: str = "", document: dict[str, Any] | None = None
) -> bytes:
    """The bytes of Meltano's document for a Singer state value, with who wrote it.

    ``document``, when given, is Meltano's halves to write as they are (the add-on's
    writes); ``value`` is then their effective Singer state.
    """
    doc = meltano_document(value) if document is None else halves(document)
    doc[WRITER_KEY] = {"serial": serial, "run_id": run_id, "written_at": round(time.time(), 6)}
    return jsonio.dumps(doc)


def _parse(data: bytes, where: str) -> Any:
    try:
        return jsonio.loads(data)
    except jsonio.DecodeError:
        raise StoreError(f"{where} is not valid JSON; fix or clear it") from None


def load(store: BlobStore, state_id: str) -> StateSnapshot:
    blob = store.read(state_key(state_id))
    if blob is None:
        return StateSnapshot(state_id, None, None)
    where = f"{store.display_uri}/{state_key(state_id)}"
    doc = _parse(blob.data, where)
    try:
        value = singer_state(doc)
    except ValueError:
        raise StoreError(f"{where} does not hold a state document") from None
    return StateSnapshot(state_id, value, blob.version, Writer.of(doc), halves(doc))


def save(
    store: BlobStore,
    state_id: str,
    value: Any,
    if_version: str | None,
    *,
    serial: int = 1,
    run_id: str = "",
    document: dict[str, Any] | None = None,
) -> str:
    """Write ``value`` only if the state is still at ``if_version`` (absent when ``None``).

    ``serial`` (the previous write's plus one) and ``run_id`` make the bytes unique.
    ``document``: Meltano's halves to store as they are (see :func:`encode_document`).
    A refusal means someone wrote the state behind the holder's back: fencing
    turns it into :class:`LeaseLost` and nothing is overwritten.
    """
    data = encode_document(value, serial=serial, run_id=run_id, document=document)
    key = state_key(state_id)
    try:
        if if_version is None:
            return store.create(key, data)
        return store.replace(key, data, if_version=if_version)
    except PreconditionFailed:
        raise LeaseLost(
            f"the state of {state_id} was changed by another writer during this run; "
            "not overwriting it"
        ) from None


def deep_merge(base: Any, new: Any) -> Any:
    """``new`` over ``base``: objects merge key by key, anything else is replaced."""
    if not isinstance(base, dict) or not isinstance(new, dict):
        return new
    merged = dict(base)
    for key, value in new.items():
        merged[key] = deep_merge(base.get(key), value) if key in base else value
    return merged
