"""The Meltano plugin definition stays in step with the settings declarations.

``plugins/mappers/mapper-state--mapper-state.yml`` is generated from
:func:`mapper_state.config.catalog` by ``scripts/gen-reference.py``, in Meltano Hub's
plugin-definition format; ``tests/e2e/test_meltano_plugin.py`` adds it to a real
Meltano project. Here: it is not stale, and it says what ``--about`` says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mapper_state.config import catalog
from tests.generated import assert_fresh
from tests.test_meltano_settings import MELTANO_KIND, _about_settings, _mapper_plugin

ROOT = Path(__file__).resolve().parent.parent
DEFINITION = ROOT / "plugins" / "mappers" / "mapper-state--mapper-state.yml"
# Meltano Hub's schemas (base_setting, mappers_specific, hub_metadata)
HUB_KINDS = {
    "oauth", "hidden", "password", "date_iso8601", "file", "email", "integer",
    "options", "object", "array", "boolean", "string", "decimal",
}  # fmt: skip
HUB_SETTING_KEYS = {"name", "aliases", "label", "value", "placeholder", "kind", "description",
                    "tooltip", "documentation", "env", "value_processor", "value_post_processor",
                    "oauth", "options", "docs", "hidden", "sensitive"}  # fmt: skip
HUB_MAPPER_KEYS = {
    "name", "pip_url", "repo", "namespace", "label", "description", "executable", "docs",
    "commands", "variant", "mappings", "logo_url", "requires", "maintenance_status",
    "domain_url", "keywords", "definition", "next_steps", "settings_preamble", "usage",
    "prereq", "capabilities", "settings", "settings_group_validation", "python", "hidden",
    "supported_python_versions", "log_parser", "ext_repo", "quality",
}  # fmt: skip
MAPPER_CAPABILITIES = {"about", "schema-flattening", "stream-maps", "structured-logging"}


def definition() -> dict[str, Any]:
    return yaml.safe_load(DEFINITION.read_text())  # type: ignore[no-any-return]


def test_the_definition_is_generated_from_todays_declarations() -> None:
    assert_fresh(DEFINITION)


def test_every_setting_with_its_kind_sensitivity_and_description() -> None:
    about = _about_settings()
    settings = definition()["settings"]
    assert [s["name"] for s in settings] == list(about) == [s.name for s in catalog()]
    for setting in settings:
        prop = about[setting["name"]]
        kind = next(t for t in prop["type"] if t != "null")
        assert setting["kind"] == MELTANO_KIND[kind], setting["name"]
        assert setting["description"] == prop["description"], setting["name"]
        assert setting.get("sensitive", False) is bool(prop.get("secret")), setting["name"]
        # a value would land in every mapping's config, above Meltano's own backend
        assert "value" not in setting, setting["name"]


def test_it_agrees_with_the_repositorys_meltano_yml() -> None:
    ours = {s["name"]: s for s in _mapper_plugin()["settings"]}
    for setting in definition()["settings"]:
        declared = ours[setting["name"]]
        assert declared["kind"] == setting["kind"], setting["name"]
        assert bool(declared.get("sensitive")) == bool(setting.get("sensitive")), setting["name"]


def test_it_is_in_meltano_hubs_format() -> None:
    doc = definition()
    assert set(doc) <= HUB_MAPPER_KEYS, set(doc) - HUB_MAPPER_KEYS
    assert {"name", "namespace", "variant", "pip_url", "executable"} <= set(doc)
    assert DEFINITION.name == f"{doc['name']}--{doc['variant']}.yml"
    assert DEFINITION.parent.name == "mappers"
    assert doc["namespace"] == "mapper_state"
    assert doc["executable"] == "mapper-state"
    assert set(doc["capabilities"]) <= MAPPER_CAPABILITIES
    for setting in doc["settings"]:
        assert set(setting) <= HUB_SETTING_KEYS, setting
        assert setting["kind"] in HUB_KINDS, setting
    names = {s["name"] for s in doc["settings"]}
    for group in doc["settings_group_validation"]:
        assert set(group) <= names
    assert (ROOT / doc["docs"].split("/blob/main/", 1)[1]).is_file(), doc["docs"]
