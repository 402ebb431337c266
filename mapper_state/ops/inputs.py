"""Reading what a user gives the operator commands: a Singer state, or an import.

Everything is checked before anything is written; a bad input is one line naming
where it is wrong (:class:`~mapper_state.errors.BadInput`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mapper_state import jsonio, log
from mapper_state.core import state
from mapper_state.errors import BadInput, InvalidStateId
from mapper_state.ops.ids import check_state_id


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
