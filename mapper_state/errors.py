"""The error tree: every user-facing failure carries its one-line message and exit code.

The command line catches :class:`MapperStateError` at the top, prints
``mapper-state: <message>`` on stderr and exits with ``exit_code``; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit codes, documented in docs/exit-codes.md and listed by each command's ``--help``."""

    OK = 0
    INTERNAL = 1
    CONFIG = 2
    LEASE_BUSY = 3
    LEASE_LOST = 4
    STORE = 5
    BAD_INPUT = 6
    TAP_FAILED = 7
    TARGET_FAILED = 8
    DOWNSTREAM_CLOSED = 9
    NOT_FOUND = 10
    UNSAFE_STORE = 11
    STALE = 12  # state list --stale: some states have not moved for that long
    UNGUARDED = 13  # a Meltano run the whole-run lease cannot guard, require_run_lease set
    INTERRUPTED = 130  # 128 + SIGINT; SIGTERM gives 143


class MapperStateError(Exception):
    """Base of every error a user can cause or must act on."""

    exit_code: int = ExitCode.INTERNAL
    #: Lines shown as they are under the one-line message (e.g. YAML to paste).
    detail: str = ""

    def __init__(self, message: str, *, exit_code: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        self.detail = detail

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__


class ConfigError(MapperStateError):
    """A setting is missing or invalid, or a config file cannot be read."""

    exit_code = ExitCode.CONFIG


class InvalidStateId(ConfigError):
    """A state ID that could escape its folder or is otherwise unusable."""


class LeaseBusy(MapperStateError):
    """Another run holds the lease on this state ID."""

    exit_code = ExitCode.LEASE_BUSY


class LeaseLost(MapperStateError):
    """Our lease was taken over, broken or expired, or the state moved behind us."""

    exit_code = ExitCode.LEASE_LOST


class LeaseLapsed(LeaseLost):
    """Our lease ran out before it could be renewed (the store did not answer in time, or
    this process was not running): given up by this run at its renewal deadline, not
    taken by another (which may happen only after the skew allowance past its expiry)."""


class LeaseBroken(LeaseLost):
    """An operator broke our lease (``lock break``): stop, and say so when releasing.

    ``free_at``: the epoch second until which the broken lease is still ours to wind down
    (no other run may take it before): a run may still write the state its target
    confirmed until then. ``None``: a forced break, free at once.
    """

    def __init__(self, message: str, free_at: float | None) -> None:
        super().__init__(message)
        self.free_at = free_at


class BadInput(MapperStateError):
    """Unusable data: a STATE message under ``--strict``, or an operator command's input."""

    exit_code = ExitCode.BAD_INPUT


class StateNotFound(MapperStateError):
    """An operator command named a state ID the store does not hold."""

    exit_code = ExitCode.NOT_FOUND


class DownstreamClosed(MapperStateError):
    """The target closed its input before the stream ended."""

    exit_code = ExitCode.DOWNSTREAM_CLOSED


class Interrupted(MapperStateError):
    """SIGINT or SIGTERM arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}", exit_code=128 + signum)
        self.signum = signum


class Unguarded(MapperStateError):
    """A ``meltano run`` that the whole-run lease cannot guard on this Meltano, refused
    because ``state_backend.require_run_lease`` is set."""

    exit_code = ExitCode.UNGUARDED
