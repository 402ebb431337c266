"""Meltano's environment: what ``meltano run`` tells a mapping, and its store URIs read as Meltano reads them.

What Meltano 4.4.1 gives a mapper (observed on real runs, see docs/real-tools.md):

- argv ``--config <file>`` holding only the mapping's ``config:`` block (nested,
  dotted or mixed keys; :func:`mapper_state.settings.flatten` merges them);
- the cwd where ``meltano`` was started (not the project root), with
  ``MELTANO_PROJECT_ROOT`` naming the root;
- ``MELTANO_ENVIRONMENT``, ``MELTANO_EXTRACTOR_NAME``, ``MELTANO_MAP__MAPPING_NAME``,
  ``MELTANO_SYS_DIR_ROOT`` and Meltano's state backend as ``MELTANO_STATE_BACKEND_*``,
  but nothing about the loader, so Meltano's state ID
  (``<environment>:<extractor>-to-<loader>``) cannot be derived: the mapping names it.

:data:`SOURCE` hands these to the settings loader as its lowest-priority source
(:class:`mapper_state.settings.SettingsSource`); the rules Meltano's runs follow
are in :mod:`mapper_state.meltano.policy`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from mapper_state.config import catalog
from mapper_state.core import inherited
from mapper_state.errors import ConfigError
from mapper_state.meltano.backend_schemes import MINIMUM_TTL_SECONDS, PREFIX, floored_ttl, store_uri
from mapper_state.redact import display_uri
from mapper_state.settings import ENV_PREFIX, Settings, SettingSpec
from mapper_state.stores import split_uri, store_types

SYSTEMDB = "systemdb"
BACKEND_URI_VAR = "MELTANO_STATE_BACKEND_URI"
#: The schemes of Meltano's own backends, which keep ``<prefix>/<state_id>/state.json`` as
#: mapper-state does. A state-backend plugin (a database, say) keeps its own layout: the
#: same URI is then the same server, but not the same state.
MELTANO_LAYOUT_SCHEMES = frozenset({"file", "s3", "azure", "gs"})


def environment(env: Mapping[str, str] | None) -> Mapping[str, str]:
    """``env``, or this process's environment when ``None``."""
    return os.environ if env is None else env


_RUN_OWNER: list[str] = []


def claim_run_owner() -> str:
    """The owner token of the run this Meltano process is, made once and named in its
    environment (:data:`~mapper_state.core.inherited.OWNER_VAR`) for the plugins it starts:
    its whole-run lease, its mapper's and its keeper's all carry it, and the add-on
    recognises them by it alone. Called in Meltano's own process only (the add-on)."""
    if not _RUN_OWNER:
        _RUN_OWNER.append(uuid.uuid4().hex)
        os.environ[inherited.OWNER_VAR] = _RUN_OWNER[0]
    return _RUN_OWNER[0]


# -- what Meltano tells us --------------------------------------------------------


@dataclass(frozen=True)
class MeltanoRun:
    """A mapping invoked by ``meltano run``, as its environment describes it."""

    mapping: str
    mapper: str | None
    environment: str | None
    extractor: str | None
    project_root: str | None
    sys_dir: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MeltanoRun | None:
        """The run, when this process is a Meltano mapping (``MELTANO_MAP__MAPPING_NAME``)."""
        env = environment(env)
        mapping = env.get("MELTANO_MAP__MAPPING_NAME")
        if not mapping:
            return None
        root = env.get("MELTANO_PROJECT_ROOT") or None
        return cls(
            mapping=mapping,
            mapper=env.get("MELTANO_MAPPER_NAME") or None,
            environment=env.get("MELTANO_ENVIRONMENT") or None,
            extractor=env.get("MELTANO_EXTRACTOR_NAME") or None,
            project_root=root,
            sys_dir=env.get("MELTANO_SYS_DIR_ROOT")
            or (os.path.join(root, ".meltano") if root else None),
        )

    def state_id_prefix(self) -> str | None:
        """``<environment>:<extractor>-to-``: how Meltano's state ID for this run begins."""
        if not self.extractor:
            return None
        env = f"{self.environment}:" if self.environment else ""
        return f"{env}{self.extractor}-to-"

    def handed_state_path(self) -> str | None:
        """Where Meltano wrote the state it handed the tap (only when it had one)."""
        if not (self.sys_dir and self.extractor):
            return None
        return os.path.join(self.sys_dir, "run", self.extractor, "state.json")


#: Meltano's pattern (``meltano.core.utils.ENV_VAR_PATTERN``): ``\\$`` escapes.
_VARIABLE = re.compile(r"(?P<escape>\\)?\$(?:{(?P<curly>\w+)}|(?P<normal>[A-Z][A-Z0-9_]*))")


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$VAR`` and ``${VAR}`` as Meltano expands them: an unset variable is empty."""

    def replace(match: re.Match[str]) -> str:
        name = match["curly"] or match["normal"]
        if match["escape"]:
            return f"${{{name}}}" if match["curly"] else f"${name}"
        return env.get(name, "")

    return _VARIABLE.sub(replace, text)


def expand_state_id(settings: Settings, env: Mapping[str, str] | None = None) -> Settings:
    """The settings of a Meltano mapping with its state ID's variables expanded.

    Meltano 4 expands ``${MELTANO_ENVIRONMENT}`` and the like in a mapping's ``config``
    before the mapper reads it; Meltano 3.7 hands it over as it is, so the ID the docs
    recommend (``${MELTANO_ENVIRONMENT}:tap-x-to-target-y``) would be taken literally: one
    lease for every environment, and not Meltano's own ID. Expanded here as Meltano does
    (:func:`expand`), from the mapper's environment, only in a Meltano mapping and only in
    the state ID (a secret may hold a ``$``); a variable the environment does not set is an
    error, where Meltano would make it empty.
    """
    env = environment(env)
    state_id = settings.state_id
    if not state_id or "$" not in state_id or MeltanoRun.from_env(env) is None:
        return settings
    for match in _VARIABLE.finditer(state_id):
        name = match["curly"] or match["normal"]
        if not match["escape"] and name not in env:
            raise ConfigError(
                f"state_id {state_id!r} names ${{{name}}}, which is not set in the "
                "environment Meltano gives the mapper"
            )
    expanded = expand(state_id, env)
    return dataclasses.replace(settings, values={**settings.values, "state_id": expanded})


def project_root(env: Mapping[str, str] | None = None) -> str | None:
    """``MELTANO_PROJECT_ROOT``: set for every plugin Meltano runs (``run``, ``invoke``)."""
    return environment(env).get("MELTANO_PROJECT_ROOT") or None


#: The Singer SDK's structured formatter: the one Meltano configures for a plugin whose
#: definition declares the ``structured-logging`` capability, and whose lines it parses.
STRUCTURED_FORMATTER = "singer_sdk.logging.StructuredFormatter"


def parses_structured_lines(env: Mapping[str, str] | None = None) -> bool:
    """Does the Meltano running this mapping parse the Singer SDK's structured log lines?

    Meltano 4.4.1 re-emits such a line at its own level (an error as an error, beside its
    "Intermediate block failed") when the plugin declares ``structured-logging``; it then
    names the SDK's structured formatter in the logging file it hands the plugin
    (``SINGER_SDK_LOG_CONFIG``). Without that capability, or outside Meltano, lines stay text.
    """
    env = environment(env)
    path = env.get("SINGER_SDK_LOG_CONFIG")
    if not (path and env.get("MELTANO_MAP__MAPPING_NAME")):
        return False
    try:
        with open(path, "rb") as f:
            config = json.load(f)
        formatter = config["formatters"]["singer_formatter"]["()"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(formatter == STRUCTURED_FORMATTER)


# -- store URIs --------------------------------------------------------------------


def meltano_file_path(uri: str) -> str | None:
    """The directory Meltano's local backend uses for a ``file:`` URI, if it can use one.

    Meltano 4.4.1 takes only the URI's path: ``file:///tmp/x`` is ``/tmp/x``, and so is
    ``file://anyhost/tmp/x``; ``file://.meltano/state`` is ``/state`` (``.meltano``
    parses as a host name). A relative path (``file:rel/x``) does not work in Meltano:
    it keeps no state there. ``None`` for those.
    """
    path = urlsplit(uri).path
    return os.path.normpath(path) if os.path.isabs(path) else None


def _meltano_file_host(uri: str) -> str:
    """The host part of a ``file://`` URI (``localhost`` counts as none: it is this machine)."""
    host = uri.partition("://")[2].partition("/")[0] if "://" in uri else ""
    return "" if host.lower() == "localhost" else host


def _meltano_file_uri(uri: str) -> str:
    spellings = (
        "write file:///absolute/path, or file://${MELTANO_PROJECT_ROOT}/.meltano/state "
        "in meltano.yml for a directory of the project"
    )
    host, path = _meltano_file_host(uri), meltano_file_path(uri)
    shown = display_uri(uri)  # a password typed into the URI stays out of the message
    if host:
        where = f"keeps the state in {path}" if path else "keeps no state"
        if "@" in host:
            host = "***@" + host.rpartition("@")[2]
        raise ConfigError(
            f"{BACKEND_URI_VAR} {shown}: Meltano reads {host!r} as a host name and {where}; "
            f"{spellings}"
        )
    if path is None:
        raise ConfigError(
            f"{BACKEND_URI_VAR} {shown} has no absolute path, and Meltano keeps no state "
            f"there (it uses only a file URI's path); {spellings}"
        )
    return "file://" + path


def from_meltano_uri(uri: str) -> str:
    """Meltano's ``state_backend.uri`` as a mapper-state URI naming the same place.

    A ``file://`` URI with a host is refused: Meltano drops the host (``file://.meltano/state``
    is ``/state`` to Meltano) where mapper-state's own settings read it as a relative
    path, so no reading of it is the place the user meant. mapper-state's own backend
    (``mapper-state+file://...``) is read as mapper-state reads it, as the add-on does.
    """
    if uri.partition(":")[0].lower().startswith(PREFIX):
        return store_uri(uri)  # mapper-state+s3://b/p is s3://b/p
    scheme = uri.partition(":")[0].lower()
    if scheme == "file":
        return _meltano_file_uri(uri)
    scheme_sep, _, rest = uri.partition("://")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc and scheme == "s3":  # s3://<key id>:<secret>@bucket: credentials come apart
        netloc = netloc.rsplit("@", 1)[1]
    return f"{scheme_sep}://{netloc}{slash}{path}" if rest else uri


def _uri_credentials(uri: str) -> dict[str, str]:
    """Meltano accepts ``s3://<key id>:<secret>@bucket/prefix``; so do we, from its variable."""
    if not uri.lower().startswith("s3://"):
        return {}
    parts = urlsplit(uri)
    found = {}
    if parts.username:
        found["state_backend.s3.aws_access_key_id"] = unquote(parts.username)
    if parts.password:
        found["state_backend.s3.aws_secret_access_key"] = unquote(parts.password)
    return found


def _aliases() -> dict[str, str]:
    """Meltano's names of store settings, where they differ from ours: ``{meltano: ours}``."""
    return {
        f"state_backend.{store.section}.{theirs}": f"state_backend.{store.section}.{ours}"
        for store in store_types()
        for theirs, ours in store.meltano_aliases.items()
    }


def meltano_variable(spec: SettingSpec) -> str | None:
    """The variable Meltano sets a ``state_backend.*`` setting with: its name upper-cased,
    dots as ``_``, after ``MELTANO_`` (``MELTANO_STATE_BACKEND_S3_REGION``); ``None`` for
    any other setting."""
    if not spec.name.startswith("state_backend."):
        return None
    return "MELTANO_" + spec.name.upper().replace(".", "_")


def exports_of_meltano(var: str, env: Mapping[str, str]) -> bool:
    """Is ``var`` (a ``MAPPER_STATE_*`` variable naming no setting) Meltano's, not a typo?

    Inside Meltano (``MELTANO_PROJECT_ROOT`` set), a name without ``__`` is: it exports
    each key of the mapping's config as ``<PLUGIN>_<KEY>`` (dots as ``_``), and reads such
    variables as overrides of the plugin's settings (the config file it hands over is
    checked instead).
    """
    return "MELTANO_PROJECT_ROOT" in env and "__" not in var[len(ENV_PREFIX) :]


def backend_settings(
    env: Mapping[str, str] | None = None, specs: Sequence[SettingSpec] | None = None
) -> dict[str, tuple[Any, str]]:
    """Meltano's ``MELTANO_STATE_BACKEND_*`` variables as our settings: ``{name: (value, var)}``.

    The lowest-priority source of the ``state_backend.*`` settings. ``systemdb`` (Meltano's
    database, the default) is not a store of ours and is ignored. The URI is kept as
    Meltano spells it; :func:`resolve_uri` reads it as Meltano does if it is the one used.
    """
    env = environment(env)
    specs = catalog() if specs is None else specs
    found: dict[str, tuple[Any, str]] = {}
    for alias, name in _aliases().items():
        var = "MELTANO_" + alias.upper().replace(".", "_")
        if env.get(var):
            found[name] = (env[var], var)
    for spec in specs:
        name_var = meltano_variable(spec)
        if name_var and env.get(name_var):
            found[spec.name] = (env[name_var], name_var)
    _floor_ttl(found)
    uri = env.get(BACKEND_URI_VAR, "").strip()
    if not uri or uri.lower() == SYSTEMDB:
        found.pop("state_backend.uri", None)
        return found
    for name, value in _uri_credentials(uri).items():
        found.setdefault(name, (value, f"{BACKEND_URI_VAR} (user-info)"))
    found["state_backend.uri"] = (uri, BACKEND_URI_VAR)
    return found


TTL_SETTING = "state_backend.lock_timeout_seconds"


def _floor_ttl(found: dict[str, tuple[Any, str]]) -> None:
    """Meltano's ``lock_timeout_seconds`` (10 s unless set) raised to the floor the add-on
    applies (:data:`MINIMUM_TTL_SECONDS`): a store call's retries get a third of the TTL."""
    if TTL_SETTING not in found:
        return
    value, var = found[TTL_SETTING]
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return  # the settings loader names the bad value
    if floored_ttl(seconds) != seconds:
        found[TTL_SETTING] = (
            f"{MINIMUM_TTL_SECONDS:g}",
            f"{var} (raised to {MINIMUM_TTL_SECONDS:g})",
        )


def resolve_uri(uri: str, source: str, env: Mapping[str, str] | None = None) -> str:
    """The store URI to use, given where it came from.

    From ``MELTANO_STATE_BACKEND_URI``: the place Meltano itself uses (:func:`from_meltano_uri`).
    Otherwise, inside a Meltano project (``MELTANO_PROJECT_ROOT``), a relative local path
    (``file://rel``, ``file:rel`` or ``rel``) is the project's: Meltano starts plugins in
    the cwd where ``meltano`` was started, which may be any directory of the project.
    """
    if source == BACKEND_URI_VAR:
        # Meltano's own file:// URIs come back absolute; mapper-state+file://rel stays
        # relative, and is the project's below, as the state backend add-on reads it
        uri = from_meltano_uri(uri)
    root = project_root(env)
    if not root:
        return uri
    scheme, location = split_uri(uri)
    if scheme != "file":
        return uri
    if "://" not in uri and uri.lower().startswith("file:"):
        location = uri[len("file:") :]
    location = os.path.expanduser(location)
    if os.path.isabs(location):
        return uri
    return "file://" + os.path.normpath(os.path.join(root, location))


def store_identity(uri: str, cwd: str | None = None) -> tuple[str, ...]:
    """What a store URI points at, for comparing two spellings of one place."""
    scheme, location = split_uri(uri)
    scheme = {"gcs": "gs", "az": "azure", "postgres": "postgresql"}.get(scheme, scheme)
    if scheme == "file":
        path = os.path.expanduser(location) or "."
        return ("file", os.path.realpath(os.path.join(cwd or os.getcwd(), path)))
    if "@" in location.split("/", 1)[0]:  # user-info before the bucket
        location = location.split("@", 1)[1]
    bucket, _, prefix = location.strip("/").partition("/")
    return (scheme, bucket, "/".join(p for p in prefix.split("/") if p))


class MeltanoSource:
    """Meltano's ``MELTANO_STATE_BACKEND_*`` variables and URI rules, as a settings source."""

    def values(
        self, specs: Sequence[SettingSpec], env: Mapping[str, str]
    ) -> dict[str, tuple[Any, str]]:
        return backend_settings(env, specs)

    def resolve_uri(self, uri: str, source: str, env: Mapping[str, str]) -> str:
        return resolve_uri(uri, source, env)

    def explains(self, var: str, env: Mapping[str, str]) -> bool:
        return exports_of_meltano(var, env)


SOURCE = MeltanoSource()
