"""Typed settings from flags, ``--config`` files and the environment: the machinery and the run's own.

A leaf: it knows how a setting is declared (:class:`SettingSpec`), how raw values
become typed ones and in which order the sources win, and it declares the
settings of a run itself (:data:`RUN_SETTINGS`). It does not know the stores:
each store declares its own settings (see :mod:`mapper_state.stores`), and
:mod:`mapper_state.config` puts the two together. Nor does it know Meltano: an
adapter at the edge may add a lowest-priority source and resolve the store URI
through a :class:`SettingsSource`.

Sources, highest first: command-line flags, ``--config`` files (later files win),
``MAPPER_STATE_<NAME>`` variables (dots become ``__``), then the extra sources.
A bad value ends the process with one line that names the setting.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from mapper_state.errors import ConfigError
from mapper_state.redact import redact, uri_secrets

SettingKind = Literal["string", "number", "integer", "boolean"]
DEFAULT_URI = "file://.mapper-state"
URI_SETTING = "state_backend.uri"


@dataclass(frozen=True)
class SettingSpec:
    """One setting: its dotted name, type, default, meaning and whether it is a secret."""

    name: str
    kind: SettingKind
    description: str
    default: Any = None
    secret: bool = False
    minimum: float | None = None
    #: A string setting that may also be given as a JSON object (kept as its JSON text).
    accepts_object: bool = False

    @property
    def env_var(self) -> str:
        return "MAPPER_STATE_" + self.name.upper().replace(".", "__")

    @property
    def meltano_env_var(self) -> str | None:
        if not self.name.startswith("state_backend."):
            return None
        return "MELTANO_" + self.name.upper().replace(".", "_")


RUN_SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec("state_id", "string", "The pipeline's state ID, e.g. `dev:tap-x-to-target-y`."),
    SettingSpec(
        URI_SETTING,
        "string",
        "Where states live: `file:///path`, `file://relative/path`, `s3://bucket/prefix`, "
        "`azure://container/prefix`, `gs://bucket/prefix` or `postgresql://user@host:port/dbname`.",
        DEFAULT_URI,
    ),
    SettingSpec(
        "state_backend.lock_timeout_seconds",
        "number",
        "Lease time-to-live; the holder renews it every third of it.",
        30.0,
        minimum=0.5,
    ),
    SettingSpec(
        "state_backend.lock_retry_seconds",
        "number",
        "Poll interval while waiting for a busy lease.",
        1.0,
        minimum=0.01,
    ),
    SettingSpec(
        "state_backend.lock_wait_seconds",
        "number",
        "How long to wait for a busy lease before failing (0 fails at once).",
        0.0,
        minimum=0,
    ),
    SettingSpec(
        "checkpoint_interval_seconds",
        "number",
        "At most one state write per interval while running; the last state is always written.",
        5.0,
        minimum=0,
    ),
    SettingSpec(
        "state_merge",
        "boolean",
        "Deep-merge each new state over the prior one instead of replacing it.",
        False,
    ),
    SettingSpec(
        "lock_only",
        "boolean",
        "Hold the lease for the run but leave `state.json` to another writer (Meltano). "
        "On by default inside Meltano when the store and ID are the ones Meltano writes.",
    ),
    SettingSpec(
        "history_keep",
        "integer",
        "How many per-run snapshots to keep for `state history` and `state rollback`.",
        20,
        minimum=0,
    ),
    SettingSpec("tap", "string", "`run`: the tap's command line."),
    SettingSpec("target", "string", "`run`: the target's command line."),
    SettingSpec("full_refresh", "boolean", "Start the tap without the prior state.", False),
    SettingSpec(
        "full_refresh_streams",
        "string",
        "Streams to extract from the start: the tap gets the prior state without their "
        "bookmarks, the others' survive. Comma-separated, or a JSON array.",
        accepts_object=True,
    ),
    SettingSpec(
        "allow_state_reset",
        "boolean",
        "Let a commit replace a state that has bookmarks with one that has none (the guard "
        "refuses it otherwise, and keeps streams a new state drops).",
        False,
    ),
    SettingSpec(
        "metrics_file",
        "string",
        "Write run metrics in Prometheus text format to this file at each commit and at "
        "exit (for node_exporter's textfile collector).",
    ),
    SettingSpec(
        "dry_run", "boolean", "Take the lease and read the state, but write nothing.", False
    ),
    SettingSpec("strict", "boolean", "Make an unusable STATE message fatal.", False),
    SettingSpec("log_format", "string", "`text` or `json` (one JSON object per line).", "text"),
)
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}

#: ``{setting name: (raw value, where it came from)}``
RawValues = dict[str, tuple[Any, str]]


class SettingsSource(Protocol):
    """A lowest-priority source of settings, and how it reads the store URI (Meltano's)."""

    def values(self, specs: Sequence[SettingSpec], env: Mapping[str, str]) -> RawValues:
        """Settings this source gives, by dotted name."""
        ...

    def resolve_uri(self, uri: str, source: str, env: Mapping[str, str]) -> str:
        """The store URI to use, given the one resolved and where it came from."""
        ...


@dataclass(frozen=True)
class Settings:
    """Resolved settings: ``values`` maps every dotted setting name to its typed value."""

    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)
    #: The names of the secret settings, for redaction.
    secret_names: frozenset[str] = frozenset()
    #: Secret values from elsewhere (the SDKs' own environment variables), for redaction.
    other_secrets: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def state_id(self) -> str | None:
        value = self.values["state_id"]
        return None if value is None else str(value)

    @property
    def uri(self) -> str:
        return str(self.values[URI_SETTING])

    @property
    def lock_timeout(self) -> float:
        return float(self.values["state_backend.lock_timeout_seconds"])

    @property
    def lock_retry(self) -> float:
        return float(self.values["state_backend.lock_retry_seconds"])

    @property
    def lock_wait(self) -> float:
        return float(self.values["state_backend.lock_wait_seconds"])

    @property
    def checkpoint_interval(self) -> float:
        return float(self.values["checkpoint_interval_seconds"])

    def section(self, name: str) -> dict[str, Any]:
        """The ``state_backend.<name>.*`` settings that are set, by short name."""
        prefix = f"state_backend.{name}."
        return {
            key[len(prefix) :]: value
            for key, value in self.values.items()
            if key.startswith(prefix) and value is not None
        }

    def secrets(self) -> list[str]:
        """Every secret value in force, for redaction."""
        found = [str(self.values[n]) for n in self.secret_names if self.values.get(n)]
        found.extend(uri_secrets(self.uri))
        found.extend(self.other_secrets)
        return [s for s in found if len(s) >= 4]

    def redact(self, text: str) -> str:
        return redact(text, self.secrets())


# -- parsing ----------------------------------------------------------------------


def coerce(spec: SettingSpec, raw: Any, source: str) -> Any:
    """Turn ``raw`` into the setting's type or raise a one-line :class:`ConfigError`."""
    where = f"setting {spec.name} (from {source})"
    if raw is None:
        return None
    if spec.kind == "string":
        if isinstance(raw, (dict, list)):
            if spec.accepts_object:
                return json.dumps(raw)
            raise ConfigError(f"{where} must be a string")
        return str(raw)
    if spec.kind == "boolean":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(f"{where} must be true or false, not {_shown(spec, raw)}")
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
    return value


def _shown(spec: SettingSpec, raw: Any) -> str:
    return "***" if spec.secret else repr(raw)


def flatten(
    config: Mapping[str, Any], known: Iterable[str] = (), prefix: str = ""
) -> dict[str, Any]:
    """``{"state_backend": {"uri": x}}`` and ``{"state_backend.uri": x}`` both give the dotted form.

    A nested object under a ``known`` name is that setting's value, not more settings.
    """
    known = known if isinstance(known, (set, frozenset)) else frozenset(known)
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and name not in known:
            flat.update(flatten(value, known, name + "."))
        else:
            flat[name] = value
    return flat


def read_config_file(path: str, known: Iterable[str]) -> dict[str, Any]:
    """A ``--config`` file's settings in dotted form; ``ENV`` means "from the environment"."""
    if path == "ENV":
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except PermissionError:
        raise ConfigError(f"config file {path} is not readable (permission denied)") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a JSON object")
    known = frozenset(known)
    flat = flatten(data, known)
    # Meltano and the Singer SDK may add keys of their own; ignore the ones we do not know
    # only when they cannot be a typo of ours.
    unknown = [k for k in flat if k not in known and k.startswith("state_backend.")]
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting {unknown[0]}")
    return {k: v for k, v in flat.items() if k in known}


def load(
    specs: Sequence[SettingSpec],
    flags: Mapping[str, Any] | None = None,
    config_files: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    sources: Sequence[SettingsSource] = (),
) -> Settings:
    """Resolve every setting in ``specs``; raise :class:`ConfigError` on the first bad one."""
    env = os.environ if env is None else env
    names = [s.name for s in specs]
    unknown = [k for k, v in (flags or {}).items() if v is not None and k not in set(names)]
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]}")
    lowest: RawValues = {}
    for extra in sources:
        lowest.update(extra.values(specs, env))
    ours = {s.name: (env[s.env_var], s.env_var) for s in specs if s.env_var in env}
    files = [(path, read_config_file(path, names)) for path in config_files]
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for spec in specs:
        raw, source = spec.default, "default"
        if spec.name in lowest:
            raw, source = lowest[spec.name]
        if spec.name in ours:
            raw, source = ours[spec.name]
        for path, data in files:
            if spec.name in data:
                raw, source = data[spec.name], f"config file {path}"
        if flags and flags.get(spec.name) is not None:
            raw, source = flags[spec.name], "command line"
        values[spec.name] = coerce(spec, raw, source)
        where[spec.name] = source
    if not values[URI_SETTING]:
        values[URI_SETTING] = DEFAULT_URI
    for extra in sources:
        values[URI_SETTING] = extra.resolve_uri(values[URI_SETTING], where[URI_SETTING], env)
    if values["log_format"] not in ("text", "json"):
        raise ConfigError(f"setting log_format (from {where['log_format']}) must be text or json")
    return Settings(values, where, frozenset(s.name for s in specs if s.secret))
