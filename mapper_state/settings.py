"""One typed settings object, from flags, ``--config`` files, env and Meltano's env.

Every setting is declared once in :data:`SETTINGS`; that table drives parsing,
the environment variable names, ``--about``'s settings schema and the example
``meltano.yml``. Sources, highest first: command-line flags, ``--config`` files
(later files win), ``MAPPER_STATE_<NAME>`` variables (dots become ``__``), then
Meltano's ``MELTANO_STATE_BACKEND_*`` variables for the ``state_backend.*`` settings.
A bad value ends the process with one line that names the setting.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mapper_state.errors import ConfigError
from mapper_state.meltano import env as meltano_env

SettingKind = Literal["string", "number", "integer", "boolean"]
DEFAULT_URI = "file://.mapper-state"


@dataclass(frozen=True)
class SettingSpec:
    """One setting: its dotted name, type, default, meaning and whether it is a secret."""

    name: str
    kind: SettingKind
    description: str
    default: Any = None
    secret: bool = False
    minimum: float | None = None

    @property
    def env_var(self) -> str:
        return "MAPPER_STATE_" + self.name.upper().replace(".", "__")

    @property
    def meltano_env_var(self) -> str | None:
        if not self.name.startswith("state_backend."):
            return None
        return "MELTANO_" + self.name.upper().replace(".", "_")


SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec("state_id", "string", "The pipeline's state ID, e.g. `dev:tap-x-to-target-y`."),
    SettingSpec(
        "state_backend.uri",
        "string",
        "Where states live: `file:///path`, `file://relative/path`, `s3://bucket/prefix`, "
        "`azure://container/prefix` or `gs://bucket/prefix`.",
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
    SettingSpec("state_backend.s3.aws_access_key_id", "string", "AWS access key ID.", secret=True),
    SettingSpec(
        "state_backend.s3.aws_secret_access_key", "string", "AWS secret access key.", secret=True
    ),
    SettingSpec("state_backend.s3.aws_session_token", "string", "AWS session token.", secret=True),
    SettingSpec(
        "state_backend.s3.endpoint_url",
        "string",
        "Endpoint of an S3-compatible store (MinIO, R2, Ceph...).",
    ),
    SettingSpec("state_backend.s3.region", "string", "AWS region of the bucket."),
    SettingSpec(
        "state_backend.s3.server_side_encryption",
        "string",
        "Server-side encryption for every write: `AES256` or `aws:kms`.",
    ),
    SettingSpec(
        "state_backend.s3.sse_kms_key_id", "string", "KMS key ID for `aws:kms` encryption."
    ),
    SettingSpec(
        "state_backend.azure.connection_string",
        "string",
        "Azure Storage connection string.",
        secret=True,
    ),
    SettingSpec(
        "state_backend.azure.storage_account_url",
        "string",
        "Azure Storage account URL, used with the default Azure credential.",
    ),
    SettingSpec(
        "state_backend.gcs.application_credentials_path",
        "string",
        "Path of a Google service-account credentials file.",
    ),
    SettingSpec(
        "state_backend.gcs.application_credentials_json",
        "string",
        "Google service-account credentials as JSON.",
        secret=True,
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
        "dry_run", "boolean", "Take the lease and read the state, but write nothing.", False
    ),
    SettingSpec("strict", "boolean", "Make an unusable STATE message fatal.", False),
    SettingSpec("log_format", "string", "`text` or `json` (one JSON object per line).", "text"),
)
SETTINGS_BY_NAME: dict[str, SettingSpec] = {s.name: s for s in SETTINGS}
SECRET_SETTINGS = frozenset(s.name for s in SETTINGS if s.secret)
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


@dataclass(frozen=True)
class Settings:
    """Resolved settings: ``values`` maps every dotted setting name to its typed value."""

    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def state_id(self) -> str | None:
        return self.values["state_id"]

    @property
    def uri(self) -> str:
        return self.values["state_backend.uri"]

    @property
    def lock_timeout(self) -> float:
        return self.values["state_backend.lock_timeout_seconds"]

    @property
    def lock_retry(self) -> float:
        return self.values["state_backend.lock_retry_seconds"]

    @property
    def lock_wait(self) -> float:
        return self.values["state_backend.lock_wait_seconds"]

    @property
    def checkpoint_interval(self) -> float:
        return self.values["checkpoint_interval_seconds"]

    def backend_options(self, scheme_key: str) -> dict[str, Any]:
        """The ``state_backend.<scheme_key>.*`` settings that are set, by short name."""
        prefix = f"state_backend.{scheme_key}."
        return {
            name[len(prefix) :]: value
            for name, value in self.values.items()
            if name.startswith(prefix) and value is not None
        }

    def secrets(self) -> list[str]:
        """Every secret value in force, for redaction."""
        found = [str(self.values[n]) for n in SECRET_SETTINGS if self.values.get(n)]
        found.extend(uri_secrets(self.uri))
        return [s for s in found if len(s) >= 4]

    def redact(self, text: str) -> str:
        return redact(text, self.secrets())


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret in ``text`` by ``***``."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


_USERINFO = re.compile(r"^(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<userinfo>[^@/]*)@")


def uri_secrets(uri: str) -> list[str]:
    """Passwords embedded in a URI's user-info (``scheme://user:password@host``)."""
    m = _USERINFO.match(uri or "")
    if not m:
        return []
    _, _, password = m.group("userinfo").partition(":")
    return [password] if password else [m.group("userinfo")]


def display_uri(uri: str) -> str:
    """A URI with its user-info hidden."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", uri or "")


# -- parsing ----------------------------------------------------------------------


def coerce(spec: SettingSpec, raw: Any, source: str) -> Any:
    """Turn ``raw`` into the setting's type or raise a one-line :class:`ConfigError`."""
    where = f"setting {spec.name} (from {source})"
    if raw is None:
        return None
    if spec.kind == "string":
        if isinstance(raw, (dict, list)):
            if spec.name == "state_backend.gcs.application_credentials_json":
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


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"state_backend": {"uri": x}}`` and ``{"state_backend.uri": x}`` both give the dotted form."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and name not in SETTINGS_BY_NAME:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def read_config_file(path: str) -> dict[str, Any]:
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
    flat = flatten(data)
    # Meltano and the Singer SDK may add keys of their own; ignore the ones we do not know
    # only when they cannot be a typo of ours.
    unknown = [k for k in flat if k not in SETTINGS_BY_NAME and k.startswith("state_backend.")]
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting {unknown[0]}")
    return {k: v for k, v in flat.items() if k in SETTINGS_BY_NAME}


def load_settings(
    flags: Mapping[str, Any] | None = None,
    config_files: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Resolve every setting from its sources; raise :class:`ConfigError` on the first bad one."""
    env = os.environ if env is None else env
    meltano = meltano_env.backend_settings(env)  # lowest priority; systemdb is ignored
    ours = {s.name: (env[s.env_var], s.env_var) for s in SETTINGS if s.env_var in env}
    files = [(path, read_config_file(path)) for path in config_files]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for spec in SETTINGS:
        raw, source = spec.default, "default"
        if spec.name in meltano:
            raw, source = meltano[spec.name]
        if spec.name in ours:
            raw, source = ours[spec.name]
        for path, data in files:
            if spec.name in data:
                raw, source = data[spec.name], f"config file {path}"
        if flags and flags.get(spec.name) is not None:
            raw, source = flags[spec.name], "command line"
        values[spec.name] = coerce(spec, raw, source)
        sources[spec.name] = source
    if not values["state_backend.uri"]:
        values["state_backend.uri"] = DEFAULT_URI
    # inside a Meltano project, a relative local store is the project's, whatever the cwd
    values["state_backend.uri"] = meltano_env.resolve_uri(
        values["state_backend.uri"], sources["state_backend.uri"], env
    )
    if values["log_format"] not in ("text", "json"):
        raise ConfigError(f"setting log_format (from {sources['log_format']}) must be text or json")
    return Settings(values, sources)
