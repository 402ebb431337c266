"""The schemes and settings of Meltano's state backend add-on, derived from the store declarations.

Meltano picks a state backend by the scheme of ``state_backend.uri`` and hands it the
``state_backend.<scheme>.*`` settings. The add-on registers one scheme per store:
``mapper-state+<store's scheme>`` (``mapper-state+s3://bucket/prefix``), so that a reader
of ``meltano.yml`` sees both that mapper-state keeps the state and on which store.
Meltano 4.4.1 accepts such a name as a URI scheme, as a settings namespace in
``meltano.yml`` and in ``meltano config set``, and turns it into environment variable
names with every other character an underscore (``MELTANO_STATE_BACKEND_MAPPER_STATE_S3_REGION``).

This module imports nothing of Meltano: ``scripts/gen-backend-entry-points.py`` writes the
entry points of ``pyproject.toml`` from it, and :mod:`mapper_state.meltano.backend` reads
its settings through it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator

from mapper_state.settings import RUN_SETTINGS, SettingSpec
from mapper_state.stores import BUILTIN, split_uri
from mapper_state.stores.base import StoreType

PREFIX = "mapper-state+"
#: Meltano 4.4 is the first with every method the add-on implements (``close``, ``get_all``,
#: ``set_all``, ``migrate``) and the keyword arguments it reads; 4.4.1 is what is tested.
MINIMUM_MELTANO = (4, 4)
#: Stores a Meltano project cannot share between its processes are not offered.
NOT_OFFERED = frozenset({"memory"})
#: What Meltano waits for a busy lease when no bound is set (its own backends wait forever).
DEFAULT_LOCK_WAIT_SECONDS = 300.0
#: The shortest lease TTL the add-on uses, whatever Meltano's ``lock_timeout_seconds`` (default
#: 10 s): the store's retries give up within a third of the TTL, and a listing of thousands of
#: states on a busy store needs more than 3 s.
MINIMUM_TTL_SECONDS = 30.0

#: Settings of a run that apply to Meltano's writes too, declared in each scheme's namespace.
RUN_SETTINGS_OFFERED = ("history_keep", "allow_state_reset")
#: The lease's bound, declared once for every scheme (the mapper plugin reads the same name).
LOCK_WAIT = SettingSpec(
    "state_backend.lock_wait_seconds",
    "number",
    "How long Meltano waits for a busy mapper-state lease before failing with the holder's "
    f"name (mapper-state's state backend; default {DEFAULT_LOCK_WAIT_SECONDS:g}).",
    minimum=0,
)


def offered_stores() -> tuple[StoreType, ...]:
    """The built-in stores the add-on offers (its entry points are written in the wheel)."""
    stores = (importlib.import_module(name).STORE for name in BUILTIN)
    return tuple(s for s in stores if s.section not in NOT_OFFERED)


def scheme_of(store: StoreType) -> str:
    """``mapper-state+s3``: the add-on's scheme for a store (its first URI scheme)."""
    return PREFIX + store.schemes[0]


def schemes() -> dict[str, StoreType]:
    """``{add-on scheme: store}``, in declaration order."""
    return {scheme_of(store): store for store in offered_stores()}


def store_uri(uri: str) -> str:
    """The store's own URI for the add-on's: ``mapper-state+s3://b/p`` is ``s3://b/p``."""
    scheme, location = split_uri(uri)
    if not scheme.startswith(PREFIX):
        return uri
    return f"{scheme.removeprefix(PREFIX)}://{location}"


def scheme_settings(store: StoreType) -> tuple[SettingSpec, ...]:
    """A scheme's settings as Meltano declares them: ``state_backend.<scheme>.<name>``.

    No defaults: a value Meltano does not pass leaves the ``MAPPER_STATE_*`` and
    ``MELTANO_STATE_BACKEND_*`` variables of the store to decide.
    """
    run = {s.name: s for s in RUN_SETTINGS}
    specs = [*store.settings, *(run[name] for name in RUN_SETTINGS_OFFERED)]
    namespace = f"state_backend.{scheme_of(store)}"
    return tuple(
        dataclasses.replace(spec, name=f"{namespace}.{spec.name}", default=None) for spec in specs
    )


def addon_settings() -> Iterator[tuple[str, SettingSpec]]:
    """Every setting the add-on declares to Meltano, with the attribute that holds it."""
    yield "lock_wait_seconds", LOCK_WAIT
    for store in offered_stores():
        for spec in scheme_settings(store):
            yield f"{store.section}__{spec.name.rsplit('.', 1)[1]}", spec


def ours(store: StoreType, short_name: str) -> str:
    """The mapper-state setting a scheme's setting ``short_name`` sets."""
    if short_name in RUN_SETTINGS_OFFERED:
        return short_name
    return f"state_backend.{store.section}.{short_name}"


def entry_points_toml() -> str:
    """The two ``[project.entry-points]`` tables of ``pyproject.toml``."""
    lines = ['[project.entry-points."meltano.state_backends"]']
    lines += [
        f'"{scheme}" = "mapper_state.meltano.backend:MapperStateBackend"' for scheme in schemes()
    ]
    lines += ["", '[project.entry-points."meltano.settings"]']
    lines += [
        f'"{spec.name}" = "mapper_state.meltano.backend_settings:{attr}"'
        for attr, spec in addon_settings()
    ]
    return "\n".join(lines) + "\n"
