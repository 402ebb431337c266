"""A bucket or container that does not exist, and the endpoint errors name, through the CLI.

A store URI naming a bucket nobody created is a setting to fix: one line that names the
bucket and the endpoint asked, exit 2, and no talk of a lease that may be held (no lease
can exist in a bucket that does not). The endpoint is the one the SDK uses, also when it
comes from the environment (``AWS_ENDPOINT_URL_S3``) rather than a setting.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.servers import Emulator, StoreLocation
from tests.support.cli import invoke
from tests.support.processes import clean_env

pytestmark = pytest.mark.cloud

#: A state write (takes the lease) and a read (takes none).
COMMANDS = [("state", "set", "dev:x-to-y", '{"bookmarks": {}}'), ("state", "get", "dev:x-to-y")]


def _missing(location: StoreLocation, name: str) -> dict[str, str]:
    """The location's environment with its bucket (container) replaced by ``name``."""
    scheme = location.emulator.scheme
    return clean_env(**{**location.env, "MAPPER_STATE_STATE_BACKEND__URI": f"{scheme}://{name}/p"})


def _one_line(result: subprocess.CompletedProcess[bytes]) -> str:
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _check(result: subprocess.CompletedProcess[bytes], what: str, where: str) -> None:
    line = _one_line(result)
    assert result.returncode == 2, line
    assert f"{what} does not exist at {where}: create it or fix state_backend.uri" in line
    assert "lease" not in line
    assert line.count("does not exist") == 1


#: Each cloud's location fixture, a bucket (container) nobody created there, what the error
#: calls it, and the scheme the error leaves out of the endpoint.
CLOUDS = [
    ("s3_location", "no-such-bucket", "S3 bucket", ""),
    ("azure_location", "no-such-container", "Azure container", "http://"),
    ("gcs_location", "no-such-bucket", "Google Cloud Storage bucket", ""),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize(("fixture", "name", "what", "scheme"), CLOUDS, ids=["s3", "azure", "gcs"])
def test_a_missing_bucket_is_one_line_naming_the_endpoint(
    request: pytest.FixtureRequest,
    fixture: str,
    name: str,
    what: str,
    scheme: str,
    command: tuple[str, ...],
) -> None:
    location: StoreLocation = request.getfixturevalue(fixture)
    result = invoke(*command, env=_missing(location, name))
    _check(result, f"{what} '{name}'", location.emulator.endpoint.removeprefix(scheme))


def _endpoint_from_environment(moto: Emulator, variable: str, uri: str) -> dict[str, str]:
    """moto's settings with the endpoint in ``variable`` (the SDK's), not in a setting."""
    env = clean_env(MAPPER_STATE_STATE_BACKEND__URI=uri, **{variable: moto.endpoint})
    for name, value in moto.options.items():
        if name != "endpoint_url":
            env[f"MAPPER_STATE_STATE_BACKEND__S3__{name.upper()}"] = value
    return env


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"])
def test_an_endpoint_from_the_environment_is_the_one_named(
    s3_location: StoreLocation, variable: str
) -> None:
    moto = s3_location.emulator
    works = _endpoint_from_environment(moto, variable, s3_location.uri)
    assert invoke("state", "set", "dev:x-to-y", '{"bookmarks": {}}', env=works).returncode == 0
    assert json.loads(invoke("state", "get", "dev:x-to-y", env=works).stdout) == {"bookmarks": {}}
    missing = _endpoint_from_environment(moto, variable, "s3://no-such-bucket/p")
    result = invoke("state", "set", "dev:x-to-y", "{}", env=missing)
    _check(result, "S3 bucket 'no-such-bucket'", moto.endpoint)
    assert "AWS S3" not in result.stderr.decode()
