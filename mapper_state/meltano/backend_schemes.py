"""The schemes and settings of Meltano's state backend add-on, derived from the store declarations.

Meltano picks a state backend by the scheme of ``state_backend.uri`` and hands it the
``state_backend.<scheme>.*`` settings. The add-on registers one scheme per store:
``mapper-state+<store's scheme>`` (``mapper-state+s3://bucket/prefix``), so that a reader
of ``meltano.yml`` sees both that mapper-state keeps the state and on which store.
Meltano 4.4.1 accepts such a name as a URI scheme, as a settings namespace in
``meltano.yml`` and in ``meltano config set``, and turns it into environment variable
names with every other character an underscore (``MELTANO_STATE_BACKEND_MAPPER_STATE_S3_REGION``).

The add-on serves every store it finds: the built-in ones, whose entry points mapper-state's
wheel declares, and those registered through the ``mapper_state.stores`` entry-point group.
Meltano finds a backend by its own ``meltano.state_backends`` entry points, so a store's
package declares its ``mapper-state+<scheme>`` there; this module prints the lines::

    python -m mapper_state.meltano.backend_schemes my_store:STORE

This module imports nothing of Meltano: ``scripts/gen-backend-entry-points.py`` writes the
entry points of ``pyproject.toml`` from it (the built-in stores only), and
:mod:`mapper_state.meltano.backend` reads its settings through it.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Iterable, Iterator

from mapper_state.settings import RUN_SETTINGS, RunCatalogue, SettingSpec
from mapper_state.stores import builtin_store_types, split_uri, store_types
from mapper_state.stores.base import StoreType

PREFIX = "mapper-state+"
#: Meltano 3.7 is the first that loads state backends from the ``meltano.state_backends``
#: entry points (3.6 has no such group). The methods newer releases added (``close``,
#: ``get_all``, ``set_all``, ``migrate``) are implemented here and simply not called by an
#: older one. Every minor from 3.7 to 4.4 is tested (``make test-meltano-versions``).
MINIMUM_MELTANO = (3, 7)
#: Stores a Meltano project cannot share between its processes are not offered.
NOT_OFFERED = frozenset({"memory"})
#: What one of Meltano's state writes (``meltano state set``, a run's write without the
#: whole-run lease) waits for a busy lease when ``lock_wait_seconds`` is not set: Meltano's
#: own backends wait forever, this one names the holder after 5 minutes.
WRITE_WAIT_DEFAULT_SECONDS = 300.0
#: What a whole ``meltano run`` waits for a busy lease when ``lock_wait_seconds`` is not set:
#: nothing, a second run is refused at once (the catalogue's default, as ``mapper-state run``).
RUN_WAIT_DEFAULT_SECONDS = 0.0
#: The shortest lease TTL the add-on uses, whatever Meltano's ``lock_timeout_seconds`` (default
#: 10 s): the store's retries give up within a third of the TTL, and a listing of thousands of
#: states on a busy store needs more than 3 s.
MINIMUM_TTL_SECONDS = 30.0

#: Settings of a run that apply to Meltano's writes too, declared in each scheme's namespace.
RUN_SETTINGS_OFFERED = ("history_keep", "allow_state_reset")
#: The lease's bound as Meltano declares it, once for every scheme: the catalogue's setting
#: (the mapper plugin reads the same name), without its flag and with the add-on's wording;
#: no default, so that each wait above applies when it is not set.
LOCK_WAIT = dataclasses.replace(
    RunCatalogue.lock_wait,
    description="How long Meltano waits for a busy mapper-state lease before failing with the "
    f"holder's name (mapper-state's state backend; default {WRITE_WAIT_DEFAULT_SECONDS:g}).",
    default=None,
    flag=None,
)
#: Refuse a ``meltano run`` the whole-run lease cannot guard, rather than warn and run.
REQUIRE_RUN_LEASE = SettingSpec(
    "state_backend.require_run_lease",
    "boolean",
    "Refuse (exit 13) a meltano run, el or elt that the whole-run lease cannot guard on "
    "this Meltano, instead of a warning (mapper-state's state backend; default false).",
)
#: The settings the add-on declares once for every scheme (Meltano passes each to it).
ADDON_SETTINGS = (LOCK_WAIT, REQUIRE_RUN_LEASE)


def floored_ttl(seconds: float) -> float:
    """A lease TTL raised to :data:`MINIMUM_TTL_SECONDS`, the one floor of every Meltano
    reading (the add-on's ``lock_timeout_seconds``, the mapper's Meltano variable)."""
    return max(seconds, MINIMUM_TTL_SECONDS)


def offered_stores() -> tuple[StoreType, ...]:
    """Every store the add-on serves: the built-in ones, then the registered ones."""
    return tuple(s for s in store_types() if s.section not in NOT_OFFERED)


def builtin_offered_stores() -> tuple[StoreType, ...]:
    """The built-in stores the add-on offers (their entry points are written in the wheel)."""
    return tuple(s for s in builtin_store_types() if s.section not in NOT_OFFERED)


def scheme_of(store: StoreType) -> str:
    """``mapper-state+s3``: the add-on's scheme for a store (its first URI scheme)."""
    return PREFIX + store.schemes[0]


def schemes(stores: Iterable[StoreType] | None = None) -> dict[str, StoreType]:
    """``{add-on scheme: store}`` of ``stores`` (default every offered one), in order."""
    chosen = offered_stores() if stores is None else stores
    return {scheme_of(store): store for store in chosen}


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


def addon_settings(
    stores: Iterable[StoreType] | None = None,
) -> Iterator[tuple[str, SettingSpec]]:
    """Every setting the add-on declares to Meltano (for ``stores``, default every offered
    one), with the attribute of :mod:`~mapper_state.meltano.backend_settings` that holds it.
    The lease's bound is the add-on's own: it comes only with the default."""
    if stores is None:
        for spec in ADDON_SETTINGS:
            yield spec.name.rsplit(".", 1)[1], spec
    for store in offered_stores() if stores is None else stores:
        for spec in scheme_settings(store):
            yield f"{store.section}__{spec.name.rsplit('.', 1)[1]}", spec


def ours(store: StoreType, short_name: str) -> str:
    """The mapper-state setting a scheme's setting ``short_name`` sets."""
    if short_name in RUN_SETTINGS_OFFERED:
        return short_name
    return f"state_backend.{store.section}.{short_name}"


def entry_points_toml(stores: Iterable[StoreType] | None = None) -> str:
    """The two ``[project.entry-points]`` tables of a ``pyproject.toml``: by default
    mapper-state's own (the built-in stores and the add-on's lease bound); for ``stores``,
    those a store's package declares so that Meltano serves it as ``mapper-state+<scheme>``.
    """
    chosen = tuple(stores) if stores is not None else builtin_offered_stores()
    lines = ['[project.entry-points."meltano.state_backends"]']
    lines += [
        f'"{scheme}" = "mapper_state.meltano.backend:MapperStateBackend"'
        for scheme in schemes(chosen)
    ]
    lines += ["", '[project.entry-points."meltano.settings"]']
    if stores is None:
        lines += [
            f'"{spec.name}" = "mapper_state.meltano.backend_settings:{attr}"'
            for attr, spec in addon_settings()
            if spec in ADDON_SETTINGS
        ]
    lines += [
        f'"{spec.name}" = "mapper_state.meltano.backend_settings:{attr}"'
        for attr, spec in addon_settings(chosen)
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Print the entry points a store's package declares: ``module:STORE`` arguments."""
    if not argv:
        print("usage: python -m mapper_state.meltano.backend_schemes module:STORE ...")
        return 2
    stores = []
    for ref in argv:
        module, _, attribute = ref.partition(":")
        store = getattr(importlib.import_module(module), attribute or "STORE")
        if not isinstance(store, StoreType):
            print(f"{ref} is not a mapper-state StoreType")
            return 2
        stores.append(store)
    sys.stdout.write(entry_points_toml(stores))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
