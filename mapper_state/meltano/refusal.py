"""How mapper-state's errors reach a Meltano user: one line on stderr, then the exit code.

Shared by the state backend (:mod:`mapper_state.meltano.backend`) and the whole-run lease
(:mod:`mapper_state.meltano.run_lease`, :mod:`mapper_state.meltano.run_hook`): the same
wording for a busy lease, the add-on's setting names instead of the store's, and a missing
library installed where Meltano runs. Imports nothing of Meltano.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Any

from mapper_state import log
from mapper_state.errors import LeaseBusy, MapperStateError
from mapper_state.meltano import backend_schemes

#: What to do about a busy lease, after the line naming its holder.
BUSY_HINT = (
    "retry when it has finished, set state_backend.lock_wait_seconds to wait for it, or "
    "`mapper-state lock break` a holder known to be dead"
)


class Refused(SystemExit):
    """A mapper-state error inside a Meltano command: one line on stderr, then the exit code.

    Meltano wraps any ``Exception`` a state write raises in its own error and prints the
    traceback; a ``SystemExit`` passes through its handlers, so the user sees the sentence.
    """

    def __init__(self, error: MapperStateError, hint: str = "") -> None:
        log.error(in_addon_words(error.message) + (f" ({hint})" if hint else ""))
        super().__init__(error.exit_code)


def refused(error: MapperStateError) -> Refused:
    """The refusal for ``error``, a busy lease with :data:`BUSY_HINT`."""
    return Refused(error, BUSY_HINT if isinstance(error, LeaseBusy) else "")


class _Translate(contextlib.AbstractContextManager[None]):
    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, MapperStateError):
            raise refused(exc) from None


def errors_as_meltano() -> contextlib.AbstractContextManager[None]:
    """Turn mapper-state's errors into a clean exit with one line."""
    return _Translate()


_EXTRA_HINT = re.compile(r"\(pip install 'mapper-state\[(?P<extra>[a-z0-9_-]+)\]'\)")


def in_addon_words(message: str, prefix: str = sys.prefix) -> str:
    """A store's message as a Meltano user can act on it: its settings by the names Meltano
    gives them (``state_backend.mapper-state+s3.region``, not ``state_backend.s3.region``),
    and a missing library installed into the environment Meltano runs from."""
    for store in backend_schemes.offered_stores():
        message = re.sub(
            rf"\bstate_backend\.{re.escape(store.section)}\.",
            f"state_backend.{backend_schemes.scheme_of(store)}.",
            message,
        )
    return _EXTRA_HINT.sub(lambda m: f"({install_hint(m['extra'], prefix)})", message)


def install_hint(extra: str, prefix: str = sys.prefix) -> str:
    """How to add ``mapper-state[extra]`` to the environment Meltano runs from."""
    wanted = f"'mapper-state[{extra}]'"
    uv_tool = Path(prefix, "uv-receipt.toml").exists()  # what `uv tool install` leaves
    if uv_tool or f"{os.sep}uv{os.sep}tools{os.sep}" in prefix + os.sep:
        return f"uv tool install --reinstall meltano --with {wanted}"
    if f"{os.sep}pipx{os.sep}venvs{os.sep}" in prefix + os.sep:
        return f"pipx inject meltano {wanted}"
    return f"{Path(prefix, 'bin', 'python')} -m pip install {wanted}"
