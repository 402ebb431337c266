"""Resolving settings from their sources, highest first.

Command-line flags, ``--config`` files (later files win), ``MAPPER_STATE_<NAME>`` variables
(dots become ``__``), then the extra sources a caller adds (:class:`SettingsSource`: a
Meltano project's ``meltano.yml``, Meltano's ``MELTANO_STATE_BACKEND_*`` variables), then
the defaults: the catalogue's, or the caller's own where it names one (``defaults``).
A bad value ends the process with one line that names the setting; a ``MAPPER_STATE_*``
variable or a config-file key that names no setting is a warning, unless it is one of
``other_variables`` or a source explains it.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from mapper_state.errors import ConfigError
from mapper_state.settings.catalogue import DEFAULT_URI, URI_SETTING
from mapper_state.settings.kinds import ENV_PREFIX, SettingSpec, coerce
from mapper_state.settings.view import Settings

#: ``{setting name: (raw value, where it came from)}``
RawValues = dict[str, tuple[Any, str]]


class SettingsSource(Protocol):
    """A lowest-priority source of settings, how it reads the store URI, and which
    ``MAPPER_STATE_*`` variables are its own business rather than typos (Meltano's)."""

    def values(self, specs: Sequence[SettingSpec], env: Mapping[str, str]) -> RawValues:
        """Settings this source gives, by dotted name."""
        ...

    def resolve_uri(self, uri: str, source: str, env: Mapping[str, str]) -> str:
        """The store URI to use, given the one resolved and where it came from."""
        ...

    def explains(self, var: str, env: Mapping[str, str]) -> bool:
        """Whether ``var``, a ``MAPPER_STATE_*`` variable that names no setting, is this
        source's own (so not reported as a typo)."""
        ...


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


def unknown_variables(
    specs: Sequence[SettingSpec],
    env: Mapping[str, str],
    other_variables: Iterable[str] = (),
    sources: Sequence[SettingsSource] = (),
) -> list[str]:
    """A warning for each ``MAPPER_STATE_*`` variable that names no setting (a typo, surely),
    except ``other_variables`` (names, or ``fnmatch`` patterns) and those a source explains."""
    known = {s.env_var: s for s in specs}
    others = tuple(other_variables)
    found = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var in known:
            continue
        if any(fnmatch.fnmatchcase(var, other) for other in others):
            continue
        if any(source.explains(var, env) for source in sources):
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
    *,
    defaults: Mapping[str, Any] | None = None,
    other_variables: Iterable[str] = (),
) -> Settings:
    """Resolve every setting in ``specs``; raise :class:`ConfigError` on the first bad one.

    ``defaults`` replaces the catalogue's default of a setting for this caller (the
    Meltano add-on's wait per state write); ``other_variables`` are ``MAPPER_STATE_*``
    variables that are not settings and not typos.
    """
    env = os.environ if env is None else env
    names = frozenset(s.name for s in specs)
    unknown = [k for k, v in (flags or {}).items() if v is not None and k not in names]
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]}{did_you_mean(unknown[0], names)}")
    lowest: RawValues = {}
    for extra in sources:
        lowest.update(extra.values(specs, env))
    ours = {s.name: (env[s.env_var], s.env_var) for s in specs if s.env_var in env}
    warnings = unknown_variables(specs, env, other_variables, sources)
    files = []
    for path in config_files:
        data, ignored = _read_config_file(path, names)
        files.append((path, data))
        warnings += ignored
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for spec in specs:
        raw, source = (defaults or {}).get(spec.name, spec.default), "default"
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
