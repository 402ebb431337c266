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

import difflib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from mapper_state.errors import ConfigError
from mapper_state.redact import redact, uri_secrets

SettingKind = Literal["string", "number", "integer", "boolean"]
#: Which commands show a setting's flag: every command that opens a store, the commands
#: that take the lease (writes and runs), or the runs only (the filter and ``run``).
FlagGroup = Literal["store", "lease", "run"]
DEFAULT_URI = "file://.mapper-state"
URI_SETTING = "state_backend.uri"
ENV_PREFIX = "MAPPER_STATE_"
#: The longest time a setting may give, about 31 years: a timeout or a sleep of a few
#: hundred years no longer fits the clock Python waits on (an internal error, not a wait).
SECONDS_MAX = 1e9
#: ``MAPPER_STATE_*`` variables that are not settings: ``MAPPER_STATE_DEBUG`` (log.py), the
#: lease an enclosing ``exec`` holds and the owner token of an enclosing Meltano run
#: (core/inherited.py), the test suite's tools directory and the chaos suite's budget
#: (tests/chaos/conftest.py).
OTHER_VARIABLES = frozenset(
    {
        "MAPPER_STATE_DEBUG",
        "MAPPER_STATE_HELD_LEASE",
        "MAPPER_STATE_RUN_OWNER",
        "MAPPER_STATE_TOOLS_DIR",
    }
)
OTHER_VARIABLE_PREFIXES = ("MAPPER_STATE_CHAOS",)


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

    @property
    def meltano_env_var(self) -> str | None:
        if not self.name.startswith("state_backend."):
            return None
        return "MELTANO_" + self.name.upper().replace(".", "_")


RUN_SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec(
        "state_id",
        "string",
        "The pipeline's state ID, e.g. `dev:tap-x-to-target-y`.",
        flag=Flag("--state-id", "The pipeline's state ID.", metavar="ID"),
    ),
    SettingSpec(
        URI_SETTING,
        "string",
        "Where states live: `file:///path`, `file://relative/path`, `s3://bucket/prefix`, "
        "`azure://container/prefix`, `gs://bucket/prefix` or `postgresql://user@host:port/dbname`.",
        DEFAULT_URI,
        flag=Flag(
            "--state-backend-uri",
            "Store URI (file://, s3://, azure://, gs://, postgresql://).",
            group="store",
            metavar="URI",
        ),
    ),
    SettingSpec(
        "state_backend.lock_timeout_seconds",
        "number",
        "Lease time-to-live; the holder renews it every third of it.",
        30.0,
        minimum=0.5,
        maximum=SECONDS_MAX,
        # every command that opens a store: a third of it bounds a store call's retries
        flag=Flag(
            "--lock-timeout-seconds",
            "Lease TTL; a third of it bounds a store call's retries.",
            group="store",
        ),
    ),
    SettingSpec(
        "state_backend.lock_retry_seconds",
        "number",
        "Poll interval while waiting for a busy lease.",
        1.0,
        minimum=0.01,
        maximum=SECONDS_MAX,
        flag=Flag("--lock-retry-seconds", "Poll interval for a busy lease.", group="lease"),
    ),
    SettingSpec(
        "state_backend.lock_wait_seconds",
        "number",
        "How long to wait for a busy lease before failing (0 fails at once).",
        0.0,
        minimum=0,
        maximum=SECONDS_MAX,
        flag=Flag("--lock-wait-seconds", "Wait this long for a busy lease.", group="lease"),
    ),
    SettingSpec(
        "checkpoint_interval_seconds",
        "number",
        "At most one state write per interval while running; the last state is always written.",
        5.0,
        minimum=0,
        maximum=SECONDS_MAX,
        flag=Flag("--checkpoint-interval-seconds", "At most one state write per interval."),
    ),
    SettingSpec(
        "state_merge",
        "boolean",
        "Deep-merge each new state over the prior one instead of replacing it.",
        False,
        flag=Flag("--state-merge", "Deep-merge each state over the prior one."),
    ),
    SettingSpec(
        "lock_only",
        "boolean",
        "Hold the lease for the run but leave `state.json` to another writer (Meltano). "
        "On by default inside Meltano when the store and ID are the ones Meltano writes.",
        flag=Flag(
            "--lock-only/--no-lock-only", "Hold the lease but leave state.json to another writer."
        ),
    ),
    SettingSpec(
        "history_keep",
        "integer",
        "How many per-run snapshots to keep for `state history` and `state rollback`.",
        20,
        minimum=0,
    ),
    SettingSpec(
        "tap",
        "string",
        "`run`: the tap's command line.",
        flag=Flag("--tap", 'The tap\'s command line, e.g. "tap-postgres --config tap.json".'),
    ),
    SettingSpec(
        "target",
        "string",
        "`run`: the target's command line.",
        flag=Flag("--target", 'The target\'s command line, e.g. "target-jsonl --config t.json".'),
    ),
    SettingSpec(
        "full_refresh",
        "boolean",
        "Start the tap without the prior state.",
        False,
        flag=Flag("--full-refresh", "Hand the tap no state."),
    ),
    SettingSpec(
        "full_refresh_streams",
        "string",
        "Streams to extract from the start: the tap gets the prior state without their "
        "bookmarks, the others' survive. Comma-separated, or a JSON array.",
        accepts_object=True,
        flag=Flag(
            "--full-refresh-stream",
            "Hand the tap the state without STREAM's bookmark, keep the others (repeatable).",
            metavar="STREAM",
            repeatable=True,
        ),
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
        flag=Flag(
            "--metrics-file", "Write Prometheus metrics here at each commit and at exit.", path=True
        ),
    ),
    SettingSpec(
        "dry_run",
        "boolean",
        "Take the lease and read the state, but write nothing.",
        False,
        flag=Flag("--dry-run", "Take the lease and read the state but write nothing."),
    ),
    SettingSpec(
        "strict",
        "boolean",
        "Make an unusable STATE message fatal.",
        False,
        flag=Flag("--strict", "An unusable STATE message is fatal."),
    ),
    SettingSpec(
        "log_format",
        "string",
        "`text` or `json` (one JSON object per line).",
        "text",
        flag=Flag("--log-format", "Log format on stderr."),
        choices=("text", "json"),
    ),
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


_T = TypeVar("_T")


def _maybe(convert: Callable[[Any], _T]) -> Callable[[Any], _T | None]:
    """``convert``, but ``None`` (a setting not set) stays ``None``."""
    return lambda value: None if value is None else convert(value)


def _log_format(value: Any) -> Literal["text", "json"]:
    return "json" if value == "json" else "text"


class _Read(Generic[_T]):
    """A typed read of one of the run's settings, declared in one line on :class:`Settings`."""

    def __init__(self, name: str, convert: Callable[[Any], _T]) -> None:
        self.name = name
        self.convert = convert

    def __get__(self, settings: Settings, owner: type[Settings] | None = None) -> _T:
        return self.convert(settings.values.get(self.name))


@dataclass(frozen=True)
class Settings:
    """Resolved settings: ``values`` maps every dotted setting name to its typed value."""

    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)
    #: The names of the secret settings, for redaction.
    secret_names: frozenset[str] = frozenset()
    #: Secret values from elsewhere (the SDKs' own environment variables), for redaction.
    other_secrets: tuple[str, ...] = ()
    #: What was probably a typo: an unknown ``MAPPER_STATE_*`` variable, an ignored config key.
    warnings: tuple[str, ...] = ()

    # Typed access to the run's own settings; a store reads its own with :meth:`section`.
    state_id = _Read("state_id", _maybe(str))
    uri = _Read(URI_SETTING, str)
    lock_timeout = _Read("state_backend.lock_timeout_seconds", float)
    lock_retry = _Read("state_backend.lock_retry_seconds", float)
    lock_wait = _Read("state_backend.lock_wait_seconds", float)
    checkpoint_interval = _Read("checkpoint_interval_seconds", float)
    state_merge = _Read("state_merge", bool)
    #: ``None`` when not set: the Meltano policy decides.
    lock_only = _Read("lock_only", _maybe(bool))
    history_keep = _Read("history_keep", int)
    tap = _Read("tap", _maybe(str))
    target = _Read("target", _maybe(str))
    full_refresh = _Read("full_refresh", bool)
    #: As given: comma-separated names or a JSON array (``core.bookmarks`` parses it).
    full_refresh_streams = _Read("full_refresh_streams", _maybe(str))
    allow_state_reset = _Read("allow_state_reset", bool)
    metrics_file = _Read("metrics_file", _maybe(str))
    dry_run = _Read("dry_run", bool)
    strict = _Read("strict", bool)
    log_format = _Read("log_format", _log_format)

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


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean X?)`` when ``name`` looks like a typo of one of ``candidates``."""
    candidates = list(candidates)
    squashed = {c.replace("_", "").replace(".", ""): c for c in candidates}
    match = squashed.get(name.replace("_", "").replace(".", ""))
    if match is None:
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.8)
        match = close[0] if close else None
    return f" (did you mean {match}?)" if match else ""


def unknown_variables(specs: Sequence[SettingSpec], env: Mapping[str, str]) -> list[str]:
    """A warning for each ``MAPPER_STATE_*`` variable that names no setting (a typo, surely).

    Inside Meltano (``MELTANO_PROJECT_ROOT`` set), a name without ``__`` is Meltano's:
    it exports each key of the mapping's config as ``<PLUGIN>_<KEY>`` (dots as ``_``),
    and reads such variables as overrides of the plugin's settings, so they are its
    business (the config file it hands over is checked instead).
    """
    known = {s.env_var: s for s in specs}
    in_meltano = "MELTANO_PROJECT_ROOT" in env
    found = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var in known or var in OTHER_VARIABLES:
            continue
        if var.startswith(OTHER_VARIABLE_PREFIXES):
            continue
        if in_meltano and "__" not in var[len(ENV_PREFIX) :]:
            continue
        hint = did_you_mean(var, known)
        found.append(f"ignored the environment variable {var}: it names no setting{hint}")
    return found


def _read_config_file(path: str, known: frozenset[str]) -> tuple[dict[str, Any], list[str]]:
    """A ``--config`` file's settings, and a warning for each key that looks like a typo."""
    if path == "ENV":
        return {}, []
    flat = flatten(_read_json_object(path), known)
    # Meltano and the Singer SDK may add keys of their own; ignore the ones we do not know
    # only when they cannot be a typo of ours.
    unknown = [k for k in flat if k not in known and k.startswith("state_backend.")]
    if unknown:
        hint = did_you_mean(unknown[0], known)
        raise ConfigError(f"config file {path}: unknown setting {unknown[0]}{hint}")
    warnings = [
        f"config file {path}: ignored the key {key}: it names no setting{hint}"
        for key in flat
        if key not in known and (hint := did_you_mean(key, known))
    ]
    return {k: v for k, v in flat.items() if k in known}, warnings


def _read_json_object(path: str) -> dict[str, Any]:
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
    return data


def load(
    specs: Sequence[SettingSpec],
    flags: Mapping[str, Any] | None = None,
    config_files: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    sources: Sequence[SettingsSource] = (),
) -> Settings:
    """Resolve every setting in ``specs``; raise :class:`ConfigError` on the first bad one."""
    env = os.environ if env is None else env
    names = frozenset(s.name for s in specs)
    unknown = [k for k, v in (flags or {}).items() if v is not None and k not in names]
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]}{did_you_mean(unknown[0], names)}")
    lowest: RawValues = {}
    for extra in sources:
        lowest.update(extra.values(specs, env))
    ours = {s.name: (env[s.env_var], s.env_var) for s in specs if s.env_var in env}
    warnings = unknown_variables(specs, env)
    files = []
    for path in config_files:
        data, ignored = _read_config_file(path, names)
        files.append((path, data))
        warnings += ignored
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for spec in specs:
        raw, source = spec.default, "default"
        if spec.name in lowest:
            raw, source = lowest[spec.name]
        if spec.name in ours:
            raw, source = ours[spec.name]
        for path, data in files:
            if data.get(spec.name) is not None:  # JSON's null: not set in this file
                raw, source = data[spec.name], f"config file {path}"
        if flags and flags.get(spec.name) is not None:
            raw, source = flags[spec.name], "command line"
        values[spec.name] = coerce(spec, raw, source)
        where[spec.name] = source
    if not values[URI_SETTING]:
        values[URI_SETTING] = DEFAULT_URI
    for extra in sources:
        values[URI_SETTING] = extra.resolve_uri(values[URI_SETTING], where[URI_SETTING], env)
    secret = frozenset(s.name for s in specs if s.secret)
    return Settings(values, where, secret, warnings=tuple(warnings))
