"""How a setting is declared, and how a raw value becomes a typed one.

A :class:`SettingSpec` is one setting: its dotted name, kind, default, bounds, flag and
whether it is a secret. The run declares its own in :mod:`~mapper_state.settings.catalogue`,
each store its own (:mod:`mapper_state.stores`); both are specs of this module. Its
``MAPPER_STATE_<NAME>`` variable (dots become ``__``) and its flag's parameter name follow
from the name. :func:`coerce` turns what a source gave into the setting's type, or fails
with one line that names the setting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from mapper_state.errors import ConfigError

SettingKind = Literal["string", "number", "integer", "boolean"]
#: Which commands show a setting's flag: every command that opens a store, the commands
#: that take the lease (writes and runs), or the runs only (the filter and ``run``).
FlagGroup = Literal["store", "lease", "run"]
ENV_PREFIX = "MAPPER_STATE_"
#: The longest time a setting may give, about 31 years: a timeout or a sleep of a few
#: hundred years no longer fits the clock Python waits on (an internal error, not a wait).
SECONDS_MAX = 1e9


@dataclass(frozen=True)
class Flag:
    """A setting's command-line flag: ``--name`` (``--name/--no-name`` for an on/off switch)."""

    opts: str
    help: str
    group: FlagGroup = "run"
    metavar: str | None = None
    #: Given once per value (``--full-refresh-stream a --full-refresh-stream b``).
    repeatable: bool = False
    #: The value names a file (not a directory).
    path: bool = False


@dataclass(frozen=True)
class SettingSpec:
    """One setting: its dotted name, type, default, meaning, flag and whether it is a secret."""

    name: str
    kind: SettingKind
    description: str
    default: Any = None
    secret: bool = False
    minimum: float | None = None
    maximum: float | None = None
    #: A string setting that may also be given as a JSON object (kept as its JSON text).
    accepts_object: bool = False
    #: The command-line flag, where the setting has one (any setting takes ``--set NAME=VALUE``).
    flag: Flag | None = None
    #: The values a string setting accepts, when it is one of a few.
    choices: tuple[str, ...] = ()

    @property
    def param_name(self) -> str:
        """The identifier a command-line parser gives the flag's value."""
        return self.name.replace(".", "_")

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper().replace(".", "__")


_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def coerce(spec: SettingSpec, raw: Any, source: str) -> Any:
    """Turn ``raw`` into the setting's type or raise a one-line :class:`ConfigError`."""
    if raw is None:
        return None
    where = f"setting {spec.name} (from {source})"
    if spec.kind == "string":
        return _string(spec, raw, where)
    if spec.kind == "boolean":
        return _boolean(spec, raw, where)
    return _number(spec, raw, where)


def _string(spec: SettingSpec, raw: Any, where: str) -> str:
    if isinstance(raw, (dict, list)):
        if spec.accepts_object:
            return json.dumps(raw)
        raise ConfigError(f"{where} must be a string")
    text = str(raw)
    if spec.choices and text not in spec.choices:
        raise ConfigError(f"{where} must be {' or '.join(spec.choices)}")
    return text


def _boolean(spec: SettingSpec, raw: Any, where: str) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{where} must be true or false, not {_shown(spec, raw)}")


def _number(spec: SettingSpec, raw: Any, where: str) -> float | int:
    try:
        if isinstance(raw, bool):
            raise ValueError
        value: float | int = int(str(raw)) if spec.kind == "integer" else float(raw)
    except (TypeError, ValueError):
        kind = "a whole number" if spec.kind == "integer" else "a number"
        raise ConfigError(f"{where} must be {kind}, not {_shown(spec, raw)}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{where} must be a finite number")
    if spec.minimum is not None and value < spec.minimum:
        raise ConfigError(f"{where} must be at least {spec.minimum:g}, not {value:g}")
    if spec.maximum is not None and value > spec.maximum:
        raise ConfigError(f"{where} must be at most {spec.maximum:g}, not {value:g}")
    return value


def _shown(spec: SettingSpec, raw: Any) -> str:
    return "***" if spec.secret else repr(raw)
