"""The run's own settings, each declared once: name, kind, default, meaning and flag.

Each is an attribute of :class:`RunCatalogue`, a :class:`RunSetting` made by
:func:`string`, :func:`number`, :func:`integer` or :func:`boolean`, whose type follows from
its kind and default (``state_id`` has none: ``str | None``). Everything else derives from
these declarations: :data:`RUN_SETTINGS` (their order is the order they are listed in),
the typed view (:class:`~mapper_state.settings.view.Settings` reads ``settings.state_id``
through the same attribute), the ``MAPPER_STATE_*`` variables, the command-line flags,
``--about``, the plugin definition, Meltano's names and ``docs/settings.md``.
The stores declare their own settings (:mod:`mapper_state.stores`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, overload

from mapper_state.settings.kinds import SECONDS_MAX, Flag, SettingSpec

DEFAULT_URI = "file://.mapper-state"
URI_SETTING = "state_backend.uri"

_T = TypeVar("_T")


class _Resolved(Protocol):
    """What a typed read needs: every setting's resolved value, by dotted name."""

    @property
    def values(self) -> Mapping[str, Any]: ...


def _as_is(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class RunSetting(SettingSpec, Generic[_T]):
    """A setting of the run: its declaration, and its typed read on resolved settings."""

    #: The value's type from its resolved value (``None`` stays ``None`` where allowed).
    read: Callable[[Any], _T] = field(default=_as_is, repr=False, compare=False)

    @overload
    def __get__(self, settings: None, owner: type | None = None) -> RunSetting[_T]: ...
    @overload
    def __get__(self, settings: _Resolved, owner: type | None = None) -> _T: ...
    def __get__(self, settings: _Resolved | None, owner: type | None = None) -> RunSetting[_T] | _T:
        if settings is None:
            return self
        return self.read(settings.values.get(self.name))


def _maybe(convert: Callable[[Any], _T]) -> Callable[[Any], _T | None]:
    """``convert``, but ``None`` (a setting not set) stays ``None``."""
    return lambda value: None if value is None else convert(value)


@overload
def string(name: str, description: str, default: str, **options: Any) -> RunSetting[str]: ...
@overload
def string(
    name: str, description: str, default: None = None, **options: Any
) -> RunSetting[str | None]: ...
def string(
    name: str, description: str, default: str | None = None, **options: Any
) -> RunSetting[str] | RunSetting[str | None]:
    """A string setting; ``None`` when not set, unless it has a default."""
    read = str if default is not None else _maybe(str)
    return RunSetting(name, "string", description, default, read=read, **options)


def number(name: str, description: str, default: float, **options: Any) -> RunSetting[float]:
    """A number of seconds, a rate: always set (it has a default)."""
    return RunSetting(name, "number", description, default, read=float, **options)


def integer(name: str, description: str, default: int, **options: Any) -> RunSetting[int]:
    """A whole number: always set (it has a default)."""
    return RunSetting(name, "integer", description, default, read=int, **options)


@overload
def boolean(name: str, description: str, default: bool, **options: Any) -> RunSetting[bool]: ...
@overload
def boolean(
    name: str, description: str, default: None = None, **options: Any
) -> RunSetting[bool | None]: ...
def boolean(
    name: str, description: str, default: bool | None = None, **options: Any
) -> RunSetting[bool] | RunSetting[bool | None]:
    """An on/off switch; ``None`` when not set, unless it has a default (another rule then
    decides, as the Meltano policy decides ``lock_only``)."""
    read = bool if default is not None else _maybe(bool)
    return RunSetting(name, "boolean", description, default, read=read, **options)


class RunCatalogue:
    """The run's settings, in the order they are listed; each attribute is one setting."""

    state_id = string(
        "state_id",
        "The pipeline's state ID, e.g. `dev:tap-x-to-target-y`.",
        flag=Flag("--state-id", "The pipeline's state ID.", metavar="ID"),
    )
    uri = string(
        URI_SETTING,
        "Where states live: `file:///path`, `file://relative/path`, `s3://bucket/prefix`, "
        "`azure://container/prefix`, `gs://bucket/prefix` or `postgresql://user@host:port/dbname`.",
        DEFAULT_URI,
        flag=Flag(
            "--state-backend-uri",
            "Store URI (file://, s3://, azure://, gs://, postgresql://).",
            group="store",
            metavar="URI",
        ),
    )
    lock_timeout = number(
        "state_backend.lock_timeout_seconds",
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
    )
    lock_retry = number(
        "state_backend.lock_retry_seconds",
        "Poll interval while waiting for a busy lease.",
        1.0,
        minimum=0.01,
        maximum=SECONDS_MAX,
        flag=Flag("--lock-retry-seconds", "Poll interval for a busy lease.", group="lease"),
    )
    lock_wait = number(
        "state_backend.lock_wait_seconds",
        "How long to wait for a busy lease before failing (0 fails at once).",
        0.0,
        minimum=0,
        maximum=SECONDS_MAX,
        flag=Flag("--lock-wait-seconds", "Wait this long for a busy lease.", group="lease"),
    )
    checkpoint_interval = number(
        "checkpoint_interval_seconds",
        "At most one state write per interval while running; the last state is always written.",
        5.0,
        minimum=0,
        maximum=SECONDS_MAX,
        flag=Flag("--checkpoint-interval-seconds", "At most one state write per interval."),
    )
    state_merge = boolean(
        "state_merge",
        "Deep-merge each new state over the prior one instead of replacing it.",
        False,
        flag=Flag("--state-merge", "Deep-merge each state over the prior one."),
    )
    #: ``None`` when not set: the Meltano policy decides.
    lock_only = boolean(
        "lock_only",
        "Hold the lease for the run but leave `state.json` to another writer (Meltano). "
        "On by default inside Meltano when the store and ID are the ones Meltano writes.",
        flag=Flag(
            "--lock-only/--no-lock-only", "Hold the lease but leave state.json to another writer."
        ),
    )
    history_keep = integer(
        "history_keep",
        "How many per-run snapshots to keep for `state history` and `state rollback`.",
        20,
        minimum=0,
    )
    runs_keep = integer(
        "runs_keep",
        "How many run records to keep per state ID for `mapper-state runs`, `state list "
        "--long` and `mapper-state metrics` (0: none are written).",
        10,
        minimum=0,
    )
    tap = string(
        "tap",
        "`run`: the tap's command line.",
        flag=Flag("--tap", 'The tap\'s command line, e.g. "tap-postgres --config tap.json".'),
    )
    target = string(
        "target",
        "`run`: the target's command line.",
        flag=Flag("--target", 'The target\'s command line, e.g. "target-jsonl --config t.json".'),
    )
    full_refresh = boolean(
        "full_refresh",
        "Start the tap without the prior state.",
        False,
        flag=Flag("--full-refresh", "Hand the tap no state."),
    )
    #: As given: comma-separated names or a JSON array (``core.bookmarks`` parses it).
    full_refresh_streams = string(
        "full_refresh_streams",
        "Streams to extract from the start: the tap gets the prior state without their "
        "bookmarks, the others' survive. Comma-separated, or a JSON array.",
        accepts_object=True,
        flag=Flag(
            "--full-refresh-stream",
            "Hand the tap the state without STREAM's bookmark, keep the others (repeatable).",
            metavar="STREAM",
            repeatable=True,
        ),
    )
    allow_state_reset = boolean(
        "allow_state_reset",
        "Let a commit replace a state that has bookmarks with one that has none (the guard "
        "refuses it otherwise, and keeps streams a new state drops).",
        False,
    )
    metrics_file = string(
        "metrics_file",
        "Write run metrics in Prometheus text format to this file at each commit and at "
        "exit (for node_exporter's textfile collector).",
        flag=Flag(
            "--metrics-file", "Write Prometheus metrics here at each commit and at exit.", path=True
        ),
    )
    dry_run = boolean(
        "dry_run",
        "Take the lease and read the state, but write nothing.",
        False,
        flag=Flag("--dry-run", "Take the lease and read the state but write nothing."),
    )
    strict = boolean(
        "strict",
        "Make an unusable STATE message fatal.",
        False,
        flag=Flag("--strict", "An unusable STATE message is fatal."),
    )
    log_format = string(
        "log_format",
        "`text` or `json` (one JSON object per line).",
        "text",
        flag=Flag("--log-format", "Log format on stderr."),
        choices=("text", "json"),
    )


#: The run's settings in the order they are declared (and listed).
RUN_SETTINGS: tuple[SettingSpec, ...] = tuple(
    value for value in vars(RunCatalogue).values() if isinstance(value, RunSetting)
)
