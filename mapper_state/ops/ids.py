"""Which state IDs an operator may name: valid ones, outside the names kept for mapper-state."""

from __future__ import annotations

from mapper_state.core.state import RESERVED_PREFIX, validate_state_id
from mapper_state.errors import InvalidStateId

__all__ = ["RESERVED_PREFIX", "check_state_id", "is_reserved"]


def is_reserved(state_id: str) -> bool:
    return state_id.split("/", 1)[0].startswith(RESERVED_PREFIX)


def check_state_id(state_id: str | None) -> str:
    """:func:`validate_state_id`, and refuse the names mapper-state keeps for itself."""
    state_id = validate_state_id(state_id)
    if is_reserved(state_id):
        raise InvalidStateId(f"state IDs starting with {RESERVED_PREFIX} are reserved")
    return state_id
