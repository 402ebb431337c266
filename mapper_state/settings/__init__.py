"""Typed settings from flags, ``--config`` files and the environment.

A leaf, split by concern:

- :mod:`~mapper_state.settings.kinds`: how a setting is declared (:class:`SettingSpec`,
  :class:`Flag`) and how a raw value becomes a typed one (:func:`coerce`);
- :mod:`~mapper_state.settings.catalogue`: the run's own settings, each declared once
  (:data:`RUN_SETTINGS`);
- :mod:`~mapper_state.settings.view`: resolved :class:`Settings`, the run's settings read
  as typed attributes derived from the catalogue;
- :mod:`~mapper_state.settings.loading`: resolving them from their sources, in order
  (:func:`load`, :class:`SettingsSource`).

It does not know the stores: each store declares its own settings (see
:mod:`mapper_state.stores`), and :mod:`mapper_state.config` puts the two together. Nor
does it know Meltano: the adapter adds a lowest-priority :class:`SettingsSource` that
reads Meltano's variables and project, resolves the store URI as Meltano does and
names the ``MAPPER_STATE_*`` variables that Meltano, not a typo, set.
"""

from mapper_state.settings.catalogue import (
    DEFAULT_URI,
    RUN_SETTINGS,
    URI_SETTING,
    RunCatalogue,
    RunSetting,
)
from mapper_state.settings.kinds import (
    ENV_PREFIX,
    SECONDS_MAX,
    Flag,
    FlagGroup,
    SettingKind,
    SettingSpec,
    coerce,
)
from mapper_state.settings.loading import (
    RawValues,
    SettingsSource,
    did_you_mean,
    flatten,
    load,
    unknown_variables,
)
from mapper_state.settings.view import Settings

__all__ = [
    "DEFAULT_URI",
    "ENV_PREFIX",
    "RUN_SETTINGS",
    "SECONDS_MAX",
    "URI_SETTING",
    "Flag",
    "FlagGroup",
    "RawValues",
    "RunCatalogue",
    "RunSetting",
    "SettingKind",
    "SettingSpec",
    "Settings",
    "SettingsSource",
    "coerce",
    "did_you_mean",
    "flatten",
    "load",
    "unknown_variables",
]
