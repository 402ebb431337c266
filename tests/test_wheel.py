"""The wheel is the product: built by ``uv build``, installed outside the checkout, run.

Everything else in the suite runs the editable install of the checkout; these tests
run what ``pip install mapper-state`` gives a stranger: the wheel's files and
metadata, and its ``mapper-state`` in a fresh virtualenv, from a directory outside
the checkout, with nothing of the source tree importable. ``pytest -m wheel`` runs
them alone.

The sdist holds what rebuilds the wheel (the package, ``pyproject.toml``, the README,
the licence, the changelog and the docs); it holds no tests, which need a checkout
(``examples/``, ``scripts/`` and the tools under ``.tools/``).
"""

from __future__ import annotations

import json
import re
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import yaml

from mapper_state.config import catalog
from tests.dist import ROOT, Dist, Installed, checkout_files
from tests.helpers import record_line, state_line
from tests.servers import StoreLocation

pytestmark = [pytest.mark.e2e, pytest.mark.wheel]

PACKAGE = "mapper_state"
URLS = ("Homepage", "Source", "Documentation", "Issues", "Changelog")


def package_files() -> set[str]:
    """Every file of the package in the checkout: its modules and its data files."""
    return {
        p
        for p in checkout_files()
        if p.startswith(f"{PACKAGE}/") and "__pycache__" not in p and not p.endswith(".pyc")
    }


def project() -> dict:  # type: ignore[type-arg]
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def metadata(wheel: Path) -> tuple[dict[str, list[str]], str]:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(z.read(name).decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    return fields, str(message.get_payload())


# -- what the archives hold ---------------------------------------------------------------


def test_the_wheel_holds_every_module_and_data_file_of_the_package(built_dist: Dist) -> None:
    with zipfile.ZipFile(built_dist.wheel) as z:
        names = set(z.namelist())
    in_wheel = {n for n in names if n.startswith(f"{PACKAGE}/")}
    missing = package_files() - in_wheel
    assert not missing, f"the wheel lacks {sorted(missing)}"
    assert f"{PACKAGE}/py.typed" in in_wheel  # a data file: the package's annotations count
    assert not any("tests/" in n or n.startswith("examples/") for n in names)
    dist_info = f"mapper_state-{project()['version']}.dist-info"
    assert f"{dist_info}/licenses/LICENSE" in names
    with zipfile.ZipFile(built_dist.wheel) as z:
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
    assert "mapper-state = mapper_state.cli:main" in entry_points


def test_the_wheel_metadata_is_complete(built_dist: Dist) -> None:
    fields, description = metadata(built_dist.wheel)
    meta = project()
    assert fields["Name"] == ["mapper-state"]
    assert fields["Version"] == [meta["version"]]
    assert fields["Summary"] == [meta["description"]]
    assert fields["License-Expression"] == ["Apache-2.0"]
    assert fields["License-File"] == ["LICENSE"]
    assert fields["Requires-Python"] == [">=3.11"]
    assert fields["Description-Content-Type"] == ["text/markdown"]
    assert description.strip() == (ROOT / "README.md").read_text().strip()
    urls = dict(u.split(", ", 1) for u in fields["Project-URL"])
    assert set(urls) == set(URLS), urls
    assert all(u.startswith("https://github.com/mapper-state/mapper-state") for u in urls.values())
    classifiers = fields["Classifier"]
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # the expression says it
    assert {"s3", "azure", "gcs", "all", "testing"} <= set(fields["Provides-Extra"])
    requires = fields["Requires-Dist"]
    assert any(r.startswith("boto3") and 'extra == "s3"' in r for r in requires)
    assert any(r.startswith("google-cloud-storage") and 'extra == "gcs"' in r for r in requires)
    # the shipped store contract needs pytest; a run never does
    pytests = [r for r in requires if r.startswith("pytest")]
    assert pytests
    assert all('extra == "testing"' in r or 'extra == "dev"' in r for r in pytests), pytests


def test_the_sdist_rebuilds_the_wheel_and_carries_the_docs(built_dist: Dist) -> None:
    with tarfile.open(built_dist.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    expected = {"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "SECURITY.md"}
    expected |= package_files()
    expected |= {p for p in checkout_files() if p.startswith("docs/") and p.endswith(".md")}
    missing = expected - names
    assert not missing, f"the sdist lacks {sorted(missing)}"
    assert not any(n.startswith("tests/") for n in names)


def test_the_dockerfile_copies_the_wheel_uv_build_makes(built_dist: Dist) -> None:
    """The image is built from ``dist/``; its COPY pattern must match the wheel's name."""
    from tests.test_dockerfile import copied_wheel_pattern

    assert copied_wheel_pattern().match(built_dist.wheel.name), built_dist.wheel.name


# -- the installed wheel ------------------------------------------------------------------


def test_it_runs_from_the_wheel_not_from_the_checkout(installed_wheel: Installed) -> None:
    where = Path(installed_wheel.python("import mapper_state; print(mapper_state.__file__)"))
    assert installed_wheel.venv in where.parents, where
    assert ROOT not in where.parents
    paths = json.loads(installed_wheel.python("import json, sys; print(json.dumps(sys.path))"))
    assert not any(p and Path(p).resolve() == ROOT for p in paths), paths

    version = installed_wheel.run("--version")
    assert version.returncode == 0, version.stderr
    assert project()["version"] in version.stdout.decode()


def test_about_lists_every_setting(installed_wheel: Installed) -> None:
    result = installed_wheel.run("--about", "--format", "json")
    assert result.returncode == 0, result.stderr
    about = json.loads(result.stdout)
    assert about["name"] == "mapper-state"
    found: list[str] = []

    def walk(node: dict, prefix: str) -> None:  # type: ignore[type-arg]
        for key, prop in node["properties"].items():
            if "properties" in prop:
                walk(prop, f"{prefix}{key}.")
            else:
                found.append(f"{prefix}{key}")

    walk(about["settings"], "")
    assert found == [spec.name for spec in catalog()]


def test_the_filter_and_state_get_on_the_local_store(installed_wheel: Installed) -> None:
    store = installed_wheel.cwd / "store"
    bookmark = {"bookmarks": {"events": {"replication_key_value": 3}}}
    stream = (
        b'{"type":"SCHEMA","stream":"events","schema":{},"key_properties":["id"]}\n'
        + b"".join(record_line(i, "events") for i in (1, 2, 3))
        + state_line(bookmark)
    )
    uri = ("--state-backend-uri", f"file://{store}")
    run = installed_wheel.run("--state-id", "dev:wheel", *uri, input=stream)
    assert run.returncode == 0, run.stderr
    assert run.stdout == stream
    got = installed_wheel.run("state", "get", "dev:wheel", *uri)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == bookmark
    document = json.loads((store / "dev:wheel" / "state.json").read_text())
    assert document["completed"]["singer_state"] == bookmark


def test_s3_with_the_s3_extra(installed_wheel: Installed, s3_location: StoreLocation) -> None:
    env = installed_wheel.env(**s3_location.env)
    value = {"bookmarks": {"events": {"replication_key_value": "2024-01-01"}}}
    put = installed_wheel.run("state", "set", "prod:wheel", json.dumps(value), env=env)
    assert put.returncode == 0, put.stderr
    got = installed_wheel.run("state", "get", "prod:wheel", env=env)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == value
    blob = s3_location.open().read("prod:wheel/state.json")
    assert blob is not None
    assert json.loads(blob.data)["completed"]["singer_state"] == value
    doctor = installed_wheel.run("doctor", "--format", "json", env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_the_plugin_definition_names_the_installed_executable(installed_wheel: Installed) -> None:
    definition = yaml.safe_load(
        (ROOT / "plugins/mappers/mapper-state--mapper-state.yml").read_text()
    )
    assert (installed_wheel.bin / definition["executable"]).is_file()
    assert re.fullmatch(r"mapper-state(\[[a-z0-9,]+\])?", definition["pip_url"])
