"""Resolved settings, and the typed view of the run's own.

:class:`Settings` holds every setting's resolved value by dotted name, where each came
from, and what must be redacted. The run's settings read as typed attributes
(``settings.lock_timeout`` is a ``float``): each attribute is the setting's declaration
in :class:`~mapper_state.settings.catalogue.RunCatalogue`, inherited, so a setting is
named once. A store reads its own settings with :meth:`Settings.section`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mapper_state.redact import redact, uri_secrets
from mapper_state.settings.catalogue import DEFAULT_URI, URI_SETTING, RunCatalogue


@dataclass(frozen=True)
class Settings(RunCatalogue):
    """Resolved settings: ``values`` maps every dotted setting name to its typed value."""

    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)
    #: The names of the secret settings, for redaction.
    secret_names: frozenset[str] = frozenset()
    #: Secret values from elsewhere (the SDKs' own environment variables), for redaction.
    other_secrets: tuple[str, ...] = ()
    #: What was probably a typo: an unknown ``MAPPER_STATE_*`` variable, an ignored config key.
    warnings: tuple[str, ...] = ()

    def origin(self, name: str) -> str:
        """Where a setting's value came from, in words: ``the command line``, ``environment
        variable MAPPER_STATE_STATE_BACKEND__URI``, ``config file x.json``, a ``meltano.yml``,
        ``the default``."""
        source = self.sources.get(name, "")
        if source == "default":
            return "the default" + (f" {DEFAULT_URI}" if name == URI_SETTING else "")
        if source == "command line":
            return "the command line"
        if source.isupper() and source.replace("_", "").isalnum():
            return f"environment variable {source}"
        return source

    def section(self, name: str) -> dict[str, Any]:
        """The ``state_backend.<name>.*`` settings that are set, by short name."""
        prefix = f"state_backend.{name}."
        return {
            key[len(prefix) :]: value
            for key, value in self.values.items()
            if key.startswith(prefix) and value is not None
        }

    def secrets(self) -> list[str]:
        """Every secret value in force, for redaction."""
        found = [str(self.values[n]) for n in self.secret_names if self.values.get(n)]
        found.extend(uri_secrets(self.uri))
        found.extend(self.other_secrets)
        return [s for s in found if len(s) >= 4]

    def redact(self, text: str) -> str:
        return redact(text, self.secrets())
