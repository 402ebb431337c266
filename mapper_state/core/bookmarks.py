"""One stream at a time: the bookmarks inside a Singer state, and the guard that keeps them.

The shapes understood are the ones taps write: singer-sdk's
``{"bookmarks": {<stream>: {"replication_key", "replication_key_value", "partitions":
[...], "progress_markers": {...}}}}`` and classic taps' flat
``{"bookmarks": {<stream>: {<key>: <value>}}}`` (or one bare value per stream), with
``currently_syncing`` beside them. A stream's bookmark is everything under
``bookmarks.<stream>``, partitions and progress markers included.

The guard stands at every commit of a run (:func:`guard`). Targets emit an empty state
on failure or on drain, which would reset the pipeline to its start date; taps and
targets sometimes emit a state missing some streams. So, unless the run asked for it:

- a state holding bookmarks is never replaced by one holding none: the prior state
  stays and a warning says how to allow it (``--full-refresh``,
  ``--full-refresh-stream``, or the ``allow_state_reset`` setting);
- streams the stored state had and the new one's ``bookmarks`` lack are merged back,
  with a warning, unless the run is a full refresh of those streams.

A state in a shape of the tap's own (values at the top level, no ``bookmarks``) is only
judged empty or not.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from mapper_state.errors import ConfigError
from mapper_state.settings import Settings

BOOKMARKS = "bookmarks"
CURRENTLY_SYNCING = "currently_syncing"
REFRESH_SETTING = "full_refresh_streams"


def bookmarks_of(value: Any) -> dict[str, Any]:
    """The ``bookmarks`` object of a state, by stream (empty when it has none)."""
    if isinstance(value, dict) and isinstance(value.get(BOOKMARKS), dict):
        return dict(value[BOOKMARKS])
    return {}


def streams(value: Any) -> list[str]:
    """The streams the state holds a bookmark for, sorted."""
    return sorted(bookmarks_of(value))


def holds_bookmarks(value: Any) -> bool:
    """Does the state hold any bookmark?

    A ``bookmarks`` object with a stream in it does; so does a state without a
    ``bookmarks`` object that keeps values of its own at the top level (a tap with a
    shape of its own), other than ``currently_syncing``. ``{}``, ``null`` and
    ``{"bookmarks": {}}`` do not.
    """
    if not isinstance(value, dict):
        return False
    if BOOKMARKS in value:
        return bool(bookmarks_of(value))
    return any(v is not None for k, v in value.items() if k != CURRENTLY_SYNCING)


def bookmark(value: Any, stream: str) -> Any:
    """The bookmark of ``stream``; :class:`KeyError` when the state has none for it."""
    return bookmarks_of(value)[stream]


def without_streams(value: Any, names: Iterable[str]) -> Any:
    """A copy of the state without the bookmarks of ``names``.

    ``currently_syncing`` naming one of them is cleared too, so a tap does not resume
    a stream it is to extract from the start.
    """
    names = set(names)
    if not names or not isinstance(value, dict) or not isinstance(value.get(BOOKMARKS), dict):
        return value
    result = dict(value)
    result[BOOKMARKS] = {s: b for s, b in value[BOOKMARKS].items() if s not in names}
    if result.get(CURRENTLY_SYNCING) in names:
        result[CURRENTLY_SYNCING] = None
    return result


def with_stream(value: Any, stream: str, new: Any) -> dict[str, Any]:
    """A copy of the state (``{}`` if none) with the bookmark of ``stream`` replaced by ``new``."""
    result = dict(value) if isinstance(value, dict) else {}
    result[BOOKMARKS] = {**bookmarks_of(value), stream: copy.deepcopy(new)}
    return result


def refreshed_streams(settings: Settings) -> frozenset[str]:
    """The streams ``--full-refresh-stream`` (``full_refresh_streams``) names."""
    return parse_stream_list(settings.full_refresh_streams)


def parse_stream_list(raw: str | None) -> frozenset[str]:
    """``a,b`` or a JSON array ``["a", "b"]`` (for names with commas); empty for none."""
    if raw is None or not str(raw).strip():
        return frozenset()
    text = str(raw).strip()
    if text.startswith("["):
        try:
            names = orjson.loads(text)
        except orjson.JSONDecodeError:
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(
                f"setting {REFRESH_SETTING} must be stream names, comma-separated or a JSON array"
            )
    else:
        names = text.split(",")
    return frozenset(n.strip() for n in names if n.strip())


def for_tap(settings: Settings, prior: Any) -> Any:
    """The prior state as the tap should get it: ``None`` for none (or a full refresh),
    else without the bookmarks of the streams to extract from the start."""
    if settings.full_refresh or prior is None:
        return None
    return without_streams(prior, refreshed_streams(settings))


# -- the guard ---------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What a commit writes: ``value``, or nothing when ``refused``; ``warning`` says why."""

    value: Any
    refused: bool = False
    kept: tuple[str, ...] = ()
    warning: str | None = None


def _shown(names: Iterable[str], limit: int = 5) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def guard(
    stored: Any,
    new: Any,
    *,
    state_id: str,
    allow_reset: bool = False,
    full_refresh: bool = False,
    refreshed: frozenset[str] = frozenset(),
) -> Verdict:
    """Decide what a commit of ``new`` over the ``stored`` state writes (see the module)."""
    if allow_reset or full_refresh or not holds_bookmarks(stored):
        return Verdict(new)
    prior = bookmarks_of(stored)
    if not holds_bookmarks(new) and not refreshed:
        return Verdict(
            None,
            refused=True,
            warning=(
                f"not committing a state without bookmarks over the state of {state_id}, "
                f"which has bookmarks for {_shown(prior) or 'its streams'}: the stored state "
                "stays. If the reset is meant, run with --full-refresh or "
                "--full-refresh-stream STREAM, or set allow_state_reset "
                "(--set allow_state_reset=true)"
            ),
        )
    if holds_bookmarks(new) and not (isinstance(new, dict) and BOOKMARKS in new):
        return Verdict(new)  # a shape of the tap's own, not per-stream bookmarks
    current = bookmarks_of(new)
    dropped = [s for s in prior if s not in current and s not in refreshed]
    if not dropped:
        return Verdict(new)
    merged = dict(new) if isinstance(new, dict) else {}
    merged[BOOKMARKS] = {**current, **{s: prior[s] for s in dropped}}
    return Verdict(
        merged,
        kept=tuple(sorted(dropped)),
        warning=(
            f"the new state of {state_id} has no bookmark for {_shown(dropped)}, which the "
            f"stored state has: kept {'it' if len(dropped) == 1 else 'them'}. To extract a "
            "stream from the start, run with --full-refresh-stream STREAM (or --full-refresh)"
        ),
    )


class CommitGuard:
    """The guard for one run: its settings, and what it has seen so far.

    It stands twice in a run's path. When a state is offered (:meth:`admit`), one
    without bookmarks is refused at once if the run already offered one with bookmarks
    (it could only displace that one before it is written) or if the stored state has
    bookmarks; so an empty state emitted on drain cannot take the place of the states
    before it. At each commit (:meth:`check`) the stored state is compared with the one
    to write, and streams it dropped are kept.

    A stream named by ``--full-refresh-stream`` is exempt from being kept only until
    this run commits a bookmark for it; from then on it is protected like any other.
    """

    def __init__(self, settings: Settings, state_id: str) -> None:
        self.state_id = state_id
        self.active = not (settings.allow_state_reset or settings.full_refresh)
        self.refused = 0
        self._pending = set(refreshed_streams(settings))
        self._offered: Any = None  # the last offered state that had bookmarks
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def admit(self, stored: Any, new: Any) -> Verdict | None:
        """A refusal of the offered state ``new``, or ``None`` to let it on to the commit."""
        if not self.active:
            return None
        if holds_bookmarks(new):
            self._offered = new
            return None
        if self._offered is not None:
            verdict = guard(self._offered, new, state_id=self.state_id)
        else:
            verdict = self.check(stored, new)
        if verdict.refused:
            with self._lock:
                self.refused += 1
            return verdict
        return None

    def check(self, stored: Any, new: Any) -> Verdict:
        """What a commit of ``new`` over the ``stored`` state writes."""
        if not self.active:
            return Verdict(new)
        with self._lock:
            pending = frozenset(self._pending)
        verdict = guard(stored, new, state_id=self.state_id, refreshed=pending)
        if verdict.refused:
            with self._lock:
                self.refused += 1
        return verdict

    def first_time(self, warning: str) -> bool:
        """Whether ``warning`` is new to this run (each is logged once)."""
        with self._lock:
            if warning in self._warned:
                return False
            self._warned.add(warning)
            return True

    def committed(self, value: Any) -> None:
        with self._lock:
            self._pending -= set(bookmarks_of(value))
