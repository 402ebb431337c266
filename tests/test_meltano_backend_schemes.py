"""The add-on's schemes and settings as Meltano sees them, derived from the store declarations."""

from __future__ import annotations

import tomllib
from pathlib import Path

from mapper_state.meltano import backend_schemes
from mapper_state.meltano.env import from_meltano_uri

ROOT = Path(__file__).resolve().parent.parent


def test_every_shared_store_has_a_scheme_naming_it() -> None:
    schemes = backend_schemes.schemes()
    assert list(schemes) == [
        "mapper-state+file",
        "mapper-state+s3",
        "mapper-state+azure",
        "mapper-state+gs",
        "mapper-state+postgresql",
    ]
    for scheme, store in schemes.items():
        assert scheme.removeprefix("mapper-state+") in store.schemes


def test_the_wheel_declares_them_to_meltano() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    backends = project["entry-points"]["meltano.state_backends"]
    assert set(backends) == set(backend_schemes.schemes(backend_schemes.builtin_offered_stores()))
    declared = project["entry-points"]["meltano.settings"]
    assert "state_backend.mapper-state+s3.aws_secret_access_key" in declared
    assert "state_backend.lock_wait_seconds" in declared
    assert "state_backend.require_run_lease" in declared
    assert {v.rpartition(":")[2] for v in declared.values()} == {
        "lock_wait_seconds",
        "require_run_lease",
        *(
            attr
            for attr, _ in backend_schemes.addon_settings(backend_schemes.builtin_offered_stores())
        ),
    }


def test_secrets_stay_secret_and_no_setting_has_a_default() -> None:
    specs = dict(backend_schemes.addon_settings())
    assert specs["s3__aws_secret_access_key"].secret
    assert specs["azure__connection_string"].secret
    assert specs["postgres__password"].secret
    assert all(spec.default is None for spec in specs.values())


def test_an_addon_uri_names_the_stores_own_place() -> None:
    assert backend_schemes.store_uri("mapper-state+s3://b/p") == "s3://b/p"
    assert backend_schemes.store_uri("mapper-state+file:///tmp/x") == "file:///tmp/x"
    assert backend_schemes.store_uri("s3://b/p") == "s3://b/p"
    # the mapper plugin inside a Meltano project on the add-on uses the same store
    assert from_meltano_uri("mapper-state+gs://b/p") == "gs://b/p"
