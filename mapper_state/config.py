"""The whole settings catalog: the run's own settings and every store's, and loading them.

:mod:`mapper_state.settings` knows how settings are declared and read; each store
declares its own (:mod:`mapper_state.stores`). This module joins the two, so that
everything that lists settings (parsing, ``MAPPER_STATE_*`` names, ``--about``,
``meltano.yml``, the docs) sees one table, whatever stores are installed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mapper_state.settings import RUN_SETTINGS, Settings, SettingSpec, SettingsSource, load
from mapper_state.stores import store_settings, store_types
from mapper_state.stores.base import StoreType

#: ``MAPPER_STATE_*`` variables that are not settings, never reported as typos: debug logs
#: (:mod:`mapper_state.log`), the lease an enclosing ``exec`` holds
#: (:mod:`mapper_state.core.inherited`), and the project's own development tools: the test
#: suite's tools directory and the chaos suite's budget (``tests/chaos/conftest.py``).
OTHER_VARIABLES = (
    "MAPPER_STATE_DEBUG",
    "MAPPER_STATE_HELD_LEASE",
    "MAPPER_STATE_RUN_OWNER",
    "MAPPER_STATE_RUN_TOKENS",
    "MAPPER_STATE_TOOLS_DIR",
    "MAPPER_STATE_CHAOS*",
)


def catalog(stores: Iterable[StoreType] | None = None) -> tuple[SettingSpec, ...]:
    """Every setting: the state ID, store location and lease, then each store's (of
    ``stores``, default every installed one), then the rest."""
    last = max(i for i, s in enumerate(RUN_SETTINGS) if s.name.startswith("state_backend."))
    return (*RUN_SETTINGS[: last + 1], *store_settings(stores), *RUN_SETTINGS[last + 1 :])


def load_settings(
    flags: Mapping[str, Any] | None = None,
    config_files: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    sources: Sequence[SettingsSource] = (),
    *,
    defaults: Mapping[str, Any] | None = None,
) -> Settings:
    """Resolve every setting of the catalog (see :func:`mapper_state.settings.load`;
    ``defaults``: the caller's own default of a setting, in place of the catalogue's).

    The secrets the stores' SDKs read from the environment are hidden like secret settings.
    """
    env = os.environ if env is None else env
    settings = load(
        catalog(),
        flags,
        config_files,
        env,
        sources,
        defaults=defaults,
        other_variables=OTHER_VARIABLES,
    )
    found = tuple(env[v] for s in store_types() for v in s.secret_env_vars if env.get(v))
    return dataclasses.replace(settings, other_secrets=found)


def settings_from_values(values: Mapping[str, Any]) -> Settings:
    """Settings already resolved elsewhere (handed to another process), with their secrets known."""
    secret = frozenset(spec.name for spec in catalog() if spec.secret)
    return Settings(dict(values), {}, secret)
