"""The Meltano project around the command line: its ``meltano.yml``'s ``state_backend``.

An operator who types ``mapper-state state list`` in a Meltano project means the states
Meltano uses, not ``.mapper-state`` beside them. The command line reads the project's
``state_backend`` as a settings source below ``MELTANO_STATE_BACKEND_URI`` (which Meltano
sets for the plugins it runs, and which wins over ``meltano.yml`` in Meltano too) and
above the embedded default.

The project is found as Meltano 4.4.1 finds it (``meltano.core.project.Project.find``):
``MELTANO_PROJECT_ROOT``, else the working directory or its nearest parent holding a
``meltano.yml``. Meltano's project settings have no per-environment values in 4.4.1
(``ProjectSettingsService.supports_environments`` is false: an environment's ``config``
holds plugins only), so the top-level ``state_backend`` is the one of every environment.
``$VAR`` and ``${VAR}`` are expanded as Meltano does (an unset variable is empty), with
``MELTANO_PROJECT_ROOT`` the project's root unless the environment sets it. Not read:
``include_paths`` files and the project's ``.env`` (Meltano reads ``MELTANO_STATE_BACKEND_*``
there; export them, or pass the URI).

Only the command line adds this source (:func:`mapper_state.cli.common.resolve_settings`):
inside Meltano, the add-on and the mapper get their store from Meltano itself, and a
command given ``--state-backend-uri`` reads no Meltano file at all. The YAML is read with
PyYAML where it is installed (Meltano depends on it, mapper-state does not); without it,
the ``state_backend`` block is read by a small reader of the block style ``meltano config
set`` writes (:func:`state_backend_block`). Nothing of Meltano is imported.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mapper_state import log
from mapper_state.errors import ConfigError
from mapper_state.meltano.backend_schemes import PREFIX, store_uri
from mapper_state.meltano.env import BACKEND_URI_VAR, SYSTEMDB, expand, from_meltano_uri
from mapper_state.settings import URI_SETTING, SettingSpec
from mapper_state.stores import split_uri, store_types

MELTANO_FILE = "meltano.yml"
ROOT_VAR = "MELTANO_PROJECT_ROOT"


def find_project(env: Mapping[str, str], cwd: str | None = None) -> Path | None:
    """The Meltano project's ``meltano.yml``, found as Meltano finds it; ``None`` outside one."""
    root = env.get(ROOT_VAR)
    if root:
        path = Path(root) / MELTANO_FILE
        return path if path.is_file() else None
    here = Path(cwd or os.getcwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / MELTANO_FILE).is_file():
            return directory / MELTANO_FILE
    return None


def _read(path: Path) -> dict[str, Any] | None:
    """The parsed file: by PyYAML where it is installed, else its ``state_backend`` block
    by :func:`state_backend_block` (what a ``uv tool install mapper-state`` has)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    try:
        import yaml
    except ImportError:
        block = state_backend_block(text)
        if block is None:
            log.warning(
                f"{path}'s state_backend is not read: it is not in block style and PyYAML is "
                "not installed (pip install pyyaml, or pass --state-backend-uri)"
            )
            return None
        return {"state_backend": block}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    return data if isinstance(data, dict) else {}


_KEY = re.compile(
    r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.+\-]+|'[^']*'|\"[^\"]*\"):(?:\s+(?P<value>.*))?$"
)


def _scalar(text: str) -> str | int | float | bool | None:
    """A YAML scalar as ``meltano.yml`` writes one: quoted, a number, a boolean, or plain."""
    text = text.strip()
    if text[:1] in ("'", '"'):
        quote = text[0]
        end = text.find(quote, 1)
        inner = text[1:end] if end > 0 else text[1:]
        return inner.replace("''", "'") if quote == "'" else inner
    text = re.sub(r"\s+#.*$", "", text)
    lowered = text.lower()
    if lowered in ("", "~", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class _Unreadable(Exception):
    """A ``state_backend`` block the small reader cannot follow."""


def _block_lines(text: str) -> list[tuple[int, str, str]] | None:
    """``(indent, key, value)`` of each line of the top-level ``state_backend`` block;
    ``None`` when the file has no such block."""
    lines: list[tuple[int, str, str]] | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("#") or line.startswith(("---", "...")):
            continue
        match = _KEY.match(line)
        if lines is None:
            if match and not match["indent"] and match["key"] == "state_backend":
                if (match["value"] or "").split("#")[0].strip():
                    raise _Unreadable  # `state_backend: {uri: ...}`
                lines = []
            continue
        if not line.startswith(" "):
            break  # the next top-level key
        if match is None:
            raise _Unreadable
        value = (match["value"] or "").strip()
        if value[:1] in ("{", "[", "&", "*", "|", ">", "!"):
            raise _Unreadable
        lines.append((len(match["indent"]), match["key"].strip("'\""), value))
    return lines


def state_backend_block(text: str) -> dict[str, Any] | None:
    """The top-level ``state_backend`` mapping of a ``meltano.yml`` in block style (what
    ``meltano config set`` writes), without PyYAML: its scalars and one level of sections
    (``state_backend.<scheme>.<key>``). ``{}`` when the file has none; ``None`` when it
    has one this reader cannot follow (flow style, anchors, multi-line values)."""
    try:
        lines = _block_lines(text)
    except _Unreadable:
        return None
    found: dict[str, Any] = {}
    section: dict[str, Any] | None = None
    top = lines[0][0] if lines else 0
    for indent, key, value in lines or ():
        scalar = value and not value.startswith("#")
        if indent == top:
            section = None if scalar else found.setdefault(key, {})
            if scalar:
                found[key] = _scalar(value)
        elif section is None or indent < top:
            return None
        elif scalar:
            section[key] = _scalar(value)
    return found


def _section_names(scheme: str) -> tuple[str, str] | None:
    """``(section in meltano.yml, our section)`` for a URI scheme of a known store."""
    store_scheme = scheme.removeprefix(PREFIX)
    for store in store_types():
        if store_scheme in store.schemes:
            return (scheme if scheme.startswith(PREFIX) else store.section), store.section
    return None


def _store_settings(
    backend: Mapping[str, Any], scheme: str, env: Mapping[str, str]
) -> dict[str, Any]:
    """The store's settings in ``state_backend.<section>``, by our dotted names."""
    names = _section_names(scheme)
    section = backend.get(names[0]) if names else None
    if not (names and isinstance(section, dict)):
        return {}
    store = next(s for s in store_types() if s.section == names[1])
    aliases = {} if scheme.startswith(PREFIX) else dict(store.meltano_aliases)
    return {
        f"state_backend.{names[1]}.{aliases.get(key, key)}": (
            expand(value, env) if isinstance(value, str) else value
        )
        for key, value in section.items()
        if value is not None and not isinstance(value, (dict, list))
    }


class ProjectSource:
    """``meltano.yml``'s ``state_backend`` as a settings source (see the module's docstring)."""

    def __init__(self, cwd: str | None = None) -> None:
        self.cwd = cwd
        self.file: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.file}" if self.file else MELTANO_FILE

    def values(
        self, specs: Sequence[SettingSpec], env: Mapping[str, str]
    ) -> dict[str, tuple[Any, str]]:
        if env.get(BACKEND_URI_VAR, "").strip():
            return {}  # Meltano's variable wins over its file, in Meltano too
        path = find_project(env, self.cwd)
        data = _read(path) if path else None
        backend = data.get("state_backend") if data else None
        if path is None or not isinstance(backend, dict):
            return {}
        expanding = {ROOT_VAR: str(path.parent), **env}
        uri = expand(str(backend.get("uri") or ""), expanding).strip()
        if not uri or uri.lower() == SYSTEMDB:
            return {}
        self.file = path
        known = {spec.name for spec in specs}
        scheme = split_uri(uri)[0]
        found = {
            name: (value, self.label)
            for name, value in _store_settings(backend, scheme, expanding).items()
            if name in known
        }
        found[URI_SETTING] = (uri, self.label)
        return found

    def explains(self, var: str, env: Mapping[str, str]) -> bool:
        return False  # meltano.yml sets no variable

    def resolve_uri(self, uri: str, source: str, env: Mapping[str, str]) -> str:
        """Read as Meltano reads it: the add-on's URI is its store's, a relative local path
        is the project's (as the add-on reads it); Meltano's own ``file://`` as Meltano does."""
        if self.file is None or source != self.label:
            return uri
        if not split_uri(uri)[0].startswith(PREFIX):
            try:
                return from_meltano_uri(uri)
            except ConfigError as exc:
                raise ConfigError(exc.message.replace(BACKEND_URI_VAR, self.label, 1)) from None
        uri = store_uri(uri)
        scheme, location = split_uri(uri)
        if scheme != "file" or os.path.isabs(os.path.expanduser(location)):
            return uri
        return "file://" + os.path.normpath(self.file.parent / location)
