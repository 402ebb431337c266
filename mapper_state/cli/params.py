"""Click parameter types of the command line: the state ID."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from mapper_state import jsonio
from mapper_state.errors import InvalidStateId
from mapper_state.ops import commands as ops

if TYPE_CHECKING:
    _ParamType = click.ParamType[str, Any]
else:  # click before 8.2 has no type parameters
    _ParamType = click.ParamType


class StateIdType(_ParamType):
    """A state ID: valid on every store, not reserved, and not a JSON state given in its place."""

    name = "state_id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if _is_json_object(text):
            raise click.UsageError(
                f"{_short(text)} is a JSON object, not a state ID: did you forget the state ID? "
                "(the state ID comes first, the state after it)",
                ctx,
            )
        try:
            return ops.check_state_id(text)
        except InvalidStateId as exc:
            raise click.UsageError(exc.message, ctx) from None


def _is_json_object(text: str) -> bool:
    if not text.lstrip().startswith("{"):
        return False
    try:
        return isinstance(jsonio.loads(text), dict)
    except jsonio.DecodeError:
        return False


def _short(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


STATE_ID = StateIdType()
