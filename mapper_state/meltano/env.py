"""Everything Meltano-specific: running as a mapping inside ``meltano run``.

What Meltano 4.4.1 gives a mapper (observed on real runs, see docs/real-tools.md):

- argv ``--config <file>`` holding only the mapping's ``config:`` block (nested,
  dotted or mixed keys; :func:`mapper_state.settings.flatten` merges them);
- the cwd where ``meltano`` was started (not the project root), with
  ``MELTANO_PROJECT_ROOT`` naming the root;
- ``MELTANO_ENVIRONMENT``, ``MELTANO_EXTRACTOR_NAME``, ``MELTANO_MAP__MAPPING_NAME``,
  ``MELTANO_SYS_DIR_ROOT`` and Meltano's state backend as ``MELTANO_STATE_BACKEND_*``,
  but nothing about the loader, so Meltano's state ID
  (``<environment>:<extractor>-to-<loader>``) cannot be derived: the mapping names it.

Meltano reads ``state.json`` before it starts any plugin, hands it to the tap in
``<MELTANO_SYS_DIR_ROOT>/run/<extractor>/state.json`` and writes the state the target
confirms after the mapper has exited. Hence, in a mapping run:

- when mapper-state's store and ID are the ones Meltano writes
  (:func:`meltano_owns_state`) it only guards the run (``lock_only``);
- after a successful run the lease is handed to a small keeper process that holds it
  until Meltano itself exits (after its final state write), see :mod:`mapper_state.meltano.keeper`;
- after taking the lease it checks that the state Meltano handed the tap is still the
  stored one (:func:`check_handed_state`): if another run finished in between, this run
  would start from a stale bookmark.

This module imports nothing heavy (it is imported by ``config``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from mapper_state.errors import ConfigError, LeaseLost
from mapper_state.stores import split_uri

if TYPE_CHECKING:
    from mapper_state.core.state import StateSnapshot
    from mapper_state.settings import Settings

SYSTEMDB = "systemdb"
BACKEND_URI_VAR = "MELTANO_STATE_BACKEND_URI"
# Meltano's state backend settings -> ours (Meltano's own names where they differ).
_BACKEND_ALIASES = {
    "state_backend.gcs.application_credentials": "state_backend.gcs.application_credentials_path",
}


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


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
        env = _env(env)
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


def project_root(env: Mapping[str, str] | None = None) -> str | None:
    """``MELTANO_PROJECT_ROOT``: set for every plugin Meltano runs (``run``, ``invoke``)."""
    return _env(env).get("MELTANO_PROJECT_ROOT") or None


# -- store URIs --------------------------------------------------------------------


def meltano_file_path(uri: str) -> str | None:
    """The directory Meltano's local backend uses for a ``file:`` URI, if it can use one.

    Meltano takes only the URI's path: ``file:///tmp/x`` is ``/tmp/x``, and so is
    ``file://anyhost/tmp/x``; ``file://.meltano/state`` is ``/state`` (``.meltano``
    parses as a host name). A relative path (``file:rel/x``) or none (``file://dir``)
    does not work in Meltano 4.4.1: it creates the directory relative to its cwd but
    reads and writes elsewhere, so no state is ever kept. ``None`` for those.
    """
    path = urlsplit(uri).path
    return os.path.normpath(path) if os.path.isabs(path) else None


def from_meltano_uri(uri: str) -> str:
    """Meltano's ``state_backend.uri`` as a mapper-state URI naming the same place."""
    scheme = uri.partition(":")[0].lower()
    if scheme == "file":
        path = meltano_file_path(uri)
        if path is None:
            raise ConfigError(
                f"{BACKEND_URI_VAR} {uri} has no absolute path, and Meltano keeps no state "
                "there (it uses only a file URI's path); use file:///absolute/path, e.g. "
                "file://${MELTANO_PROJECT_ROOT}/.meltano/state in meltano.yml"
            )
        return "file://" + path
    scheme_sep, _, rest = uri.partition("://")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:  # s3://<key id>:<secret>@bucket/prefix: credentials come apart
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


def backend_settings(env: Mapping[str, str] | None = None) -> dict[str, tuple[Any, str]]:
    """Meltano's ``MELTANO_STATE_BACKEND_*`` variables as our settings: ``{name: (value, var)}``.

    The lowest-priority source of the ``state_backend.*`` settings. ``systemdb`` (Meltano's
    database, the default) is not a store of ours and is ignored. The URI is kept as
    Meltano spells it; :func:`resolve_uri` reads it as Meltano does if it is the one used.
    """
    from mapper_state.settings import SETTINGS

    env = _env(env)
    found: dict[str, tuple[Any, str]] = {}
    for alias, name in _BACKEND_ALIASES.items():
        var = "MELTANO_" + alias.upper().replace(".", "_")
        if env.get(var):
            found[name] = (env[var], var)
    for spec in SETTINGS:
        var = spec.meltano_env_var
        if var and env.get(var):
            found[spec.name] = (env[var], var)
    uri = env.get(BACKEND_URI_VAR, "").strip()
    if not uri or uri.lower() == SYSTEMDB:
        found.pop("state_backend.uri", None)
        return found
    for name, value in _uri_credentials(uri).items():
        found.setdefault(name, (value, f"{BACKEND_URI_VAR} (user-info)"))
    found["state_backend.uri"] = (uri, BACKEND_URI_VAR)
    return found


def resolve_uri(uri: str, source: str, env: Mapping[str, str] | None = None) -> str:
    """The store URI to use, given where it came from.

    From ``MELTANO_STATE_BACKEND_URI``: the place Meltano itself uses (:func:`from_meltano_uri`).
    Otherwise, inside a Meltano project (``MELTANO_PROJECT_ROOT``), a relative local path
    (``file://rel``, ``file:rel`` or ``rel``) is the project's: Meltano starts plugins in
    the cwd where ``meltano`` was started, which may be any directory of the project.
    """
    if source == BACKEND_URI_VAR:
        return from_meltano_uri(uri)
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
    scheme = {"gcs": "gs", "az": "azure"}.get(scheme, scheme)
    if scheme == "file":
        path = os.path.expanduser(location) or "."
        return ("file", os.path.realpath(os.path.join(cwd or os.getcwd(), path)))
    if "@" in location.split("/", 1)[0]:  # user-info before the bucket
        location = location.split("@", 1)[1]
    bucket, _, prefix = location.strip("/").partition("/")
    return (scheme, bucket, "/".join(p for p in prefix.split("/") if p))


# -- the state Meltano writes --------------------------------------------------------


def meltano_owns_state(settings: Settings, env: Mapping[str, str] | None = None) -> bool:
    """Is mapper-state's state the one Meltano writes (same store, Meltano's state ID)?

    Meltano's ID is ``<environment>:<extractor>-to-<loader>``; the loader is not known
    to a mapper, so any ID with this run's ``<environment>:<extractor>-to-`` prefix counts.
    """
    env = _env(env)
    run = MeltanoRun.from_env(env)
    meltano_uri = env.get(BACKEND_URI_VAR, "").strip()
    if run is None or not meltano_uri or meltano_uri.lower() == SYSTEMDB:
        return False
    prefix = run.state_id_prefix()
    if not (prefix and settings.state_id and settings.state_id.startswith(prefix)):
        return False
    try:
        meltanos = from_meltano_uri(meltano_uri)
    except ConfigError:
        return False  # a URI Meltano cannot use: it keeps no state there
    return store_identity(meltanos) == store_identity(settings.uri)


def lock_only(settings: Settings, env: Mapping[str, str] | None = None) -> bool:
    """The ``lock_only`` setting, defaulting to :func:`meltano_owns_state`."""
    from mapper_state import log

    explicit = settings["lock_only"]
    owned = meltano_owns_state(settings, env)
    if explicit is None:
        if owned:
            log.info(
                f"{settings.state_id} is Meltano's own state: holding its lease for the run "
                "and leaving state.json to Meltano (lock_only)"
            )
        return owned
    if owned and not explicit:
        log.warning(
            f"lock_only is off but {settings.state_id} in this store is Meltano's own state: "
            "both will write it, and a state Meltano writes during the run makes mapper-state's "
            "next write fail; leave lock_only unset to let Meltano write it alone"
        )
    return bool(explicit)


def missing_state_id(env: Mapping[str, str] | None = None) -> ConfigError | None:
    """In a Meltano mapping without ``state_id``: the error saying what to add to meltano.yml."""
    run = MeltanoRun.from_env(env)
    if run is None:
        return None
    prefix = run.state_id_prefix() or "<environment>:<extractor>-to-"
    mapper = f"the mapper {run.mapper}" if run.mapper else "the mapper"
    return ConfigError(
        f"setting state_id is missing in the Meltano mapping {run.mapping}; add to meltano.yml: "
        f"mappings: - name: {run.mapping} config: state_id: {prefix}<loader> (under {mapper}, "
        "with your loader's name: Meltano does not tell a mapper which loader follows)"
    )


def check_handed_state(
    settings: Settings, prior: StateSnapshot, where: str, env: Mapping[str, str] | None = None
) -> None:
    """Refuse a run whose tap got an older state than the one stored now.

    Meltano reads the state before the mapper starts (and takes the lease): if another
    run of the pipeline wrote its final state in between, the tap is resuming from a
    stale bookmark and would load the same rows again. Only checked when the store and
    ID are Meltano's and Meltano handed the tap a state file.
    """
    run = MeltanoRun.from_env(env)
    if run is None or not meltano_owns_state(settings, env):
        return
    if _env(env).get("MELTANO_EXTRACT__STATE"):  # the tap got a state file of the user's
        return
    path = run.handed_state_path()
    if not path:
        return
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return  # no state handed over: a first run or --full-refresh
    import orjson

    try:
        handed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return
    if handed == prior.value:
        return
    raise LeaseLost(
        f"the state Meltano handed {run.extractor} is not the state of {settings.state_id} "
        f"in {where} now: another run of this pipeline wrote its state after Meltano read it "
        "(run again to resume from it), or state_id is not this pipeline's Meltano state ID "
        f"({run.state_id_prefix() or ''}<loader>)"
    )
