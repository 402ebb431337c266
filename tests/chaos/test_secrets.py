"""Secrets never leak: not in any output of any command, SDK debug logs included, nor in
anything written to the store.

Keys, connection strings, credentials JSON and passwords in URIs are given every way a
user can give them (``--set`` on the command line, environment variables, ``--config``
files), with ``MAPPER_STATE_DEBUG=1`` (the retry layer's and the SDKs' debug logs) and the
Google SDK's own ``GOOGLE_SDK_PYTHON_LOGGING_SCOPE`` turned on. Every command's stdout and
stderr is captured, and afterwards every object in the bucket (lease records, history
snapshots, ``state.json``) is read back; no secret may appear in any of it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import cli
from tests.chaos.conftest import BUDGET, record_figures
from tests.helpers import MAPPER, clean_env, wait_until
from tests.pg import PostgresLocation
from tests.servers import Emulator, StoreLocation

pytestmark = pytest.mark.cloud
DEBUG = {
    "MAPPER_STATE_DEBUG": "1",
    "GOOGLE_SDK_PYTHON_LOGGING_SCOPE": "google",
    "AWS_EC2_METADATA_DISABLED": "true",  # no credential lookup beyond this machine
}


class Captured:
    """Everything the commands printed."""

    outputs: list[tuple[list[str], bytes]]

    def __init__(self, cwd: Path) -> None:
        self.outputs = []
        self.cwd = cwd  # a relative file:// URI lands here, not in the repository

    def run(self, args: list[str], env: dict[str, str], input: bytes = b"") -> Any:
        import subprocess

        proc = subprocess.run(
            [MAPPER, *args], input=input, capture_output=True, env=env, timeout=120,
            cwd=self.cwd, check=False,
        )  # fmt: skip
        self.outputs.append((args, proc.stdout + b"\n" + proc.stderr))
        return proc

    def spawn(self, args: list[str], env: dict[str, str]) -> Any:
        return cli.spawn(None, *args, env=env)  # type: ignore[arg-type]

    def add(self, args: list[str], data: bytes) -> None:
        self.outputs.append((args, data))


#: A leak is any piece of a secret this long: a record cut at 200 characters, or a
#: wrapped line, shows a part of a secret, never the whole.
FRAGMENT = 12


def fragments(secret: str, whole: bool = False) -> set[bytes]:
    """Every ``FRAGMENT``-character piece of ``secret`` (or all of it: ``whole``), raw and as
    JSON escapes it."""
    pieces = set()
    for form in (secret, json.dumps(secret)[1:-1]):
        size = len(form) if whole else min(FRAGMENT, len(form))
        pieces |= {form[i : i + size].encode() for i in range(len(form) - size + 1)}
    return pieces


def leaks(secrets: list[str], blobs: list[tuple[str, bytes]], whole: bool = False) -> list[str]:
    found = []
    for secret in secrets:
        pieces = fragments(secret, whole)
        for where, data in blobs:
            piece = next((p for p in pieces if p in data), None)
            if piece is not None:
                found.append(f"{len(piece)} characters of {secret[:4]}... in {where}")
    return found


def every_object(location: StoreLocation) -> list[tuple[str, bytes]]:
    """Every object in the bucket or container, whatever its prefix."""
    root = location.open(uri=f"{location.emulator.scheme}://{location.bucket}")
    return [(key, root.read(key).data) for key in root.list() if root.read(key) is not None]  # type: ignore[union-attr]


def exercise(
    captured: Captured,
    base_env: dict[str, str],
    given: list[tuple[list[str], dict[str, str]]],
    state_id: str,
) -> None:
    """Run the commands a user runs, with the settings given in each of the ways."""
    for i, (flags, extra_env) in enumerate(given):
        env = {**base_env, **extra_env}
        sid = f"{state_id}-{i}"
        line = json.dumps({"type": "STATE", "value": {"bookmarks": {"s": i}}}).encode() + b"\n"
        proc = captured.run(["--state-id", sid, *flags], env, input=line)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        holder = cli.spawn(None, "--state-id", sid, *flags, env=env)  # type: ignore[arg-type]
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                status = captured.run(["lock", "status", sid, "--format", "json", *flags], env)
                if json.loads(status.stdout or b"{}").get("status") == "held":
                    break
                time.sleep(0.2)
            captured.run(["lock", "status", sid, *flags], env)
            captured.run(["state", "list", "--long", *flags], env)
        finally:
            out, err = holder.communicate(line, timeout=60)
            captured.add(["holder"], out + err)
        operator = OPERATOR_COMMANDS if (i == 0 or BUDGET.full) else OPERATOR_COMMANDS[:3]
        for args in operator:
            captured.run([a.replace("{sid}", sid) for a in args] + flags, env)


#: What a user runs against the store; with the small budget, all of them for the first way of
#: giving the settings and the first three for the others.
OPERATOR_COMMANDS = (
    ["state", "history", "{sid}", "--format", "json"],
    ["state", "get", "{sid}"],
    ["state", "get", "{sid}", "--format", "json", "--meltano"],
    ["state", "set", "{sid}", '{"bookmarks": {"s": 99}}'],
    ["state", "merge", "{sid}", '{"bookmarks": {"t": 1}}'],
    ["state", "history", "{sid}"],
    ["state", "export"],
    ["state", "list", "--format", "json"],
    ["doctor"],
    ["doctor", "--format", "json"],
    ["--about"],
    ["--about", "--format", "json"],
    ["state", "get", "no-such-id"],
)


def check(
    captured: Captured,
    location: StoreLocation,
    secrets: list[str],
    kind: str,
    whole: tuple[str, ...] = (),
) -> None:
    """No fragment of ``secrets`` (nor any of ``whole``, a secret with public parts such as
    a connection string's endpoint) in any output or stored object."""
    outputs = [(" ".join(a[:3]), data) for a, data in captured.outputs]
    objects = every_object(location)
    found = leaks(secrets, outputs) + leaks(secrets, objects)
    found += leaks(list(whole), outputs, whole=True) + leaks(list(whole), objects, whole=True)
    record_figures(
        "secrets",
        kind,
        commands=len(outputs),
        output_bytes=sum(len(d) for _, d in outputs),
        objects_read=len(objects),
        leaks=len(found),
    )
    assert objects, "nothing was written: the check would prove nothing"
    assert not found, "secrets leaked:\n" + "\n".join(found[:20])


def exercise_every_way(
    captured: Captured,
    base: dict[str, str],
    section: str,
    settings: dict[str, str],
    tmp_path: Path,
    other: tuple[str, dict[str, str], list[str]],
) -> None:
    """The settings given in each of :func:`ways`; with the full budget also ``other``, one
    more way of giving the same secrets (its name, its environment and its flags)."""
    exercise(captured, base, ways(section, settings, tmp_path), f"chaos:secrets-{section}")
    if BUDGET.full:
        name, env, flags = other
        exercise(captured, env, [(flags, {})], f"chaos:secrets-{section}-{name}")


def ways(
    section: str, settings: dict[str, str], tmp_path: Path
) -> list[tuple[list[str], dict[str, str]]]:
    """The same settings on the command line, in the environment, and in a --config file.

    With the small budget only the command line: the way that once leaked into the store.
    """
    config = tmp_path / f"{section}-config.json"
    config.write_text(json.dumps({"state_backend": {section: settings}}))
    config.chmod(0o600)
    found = [
        (
            [
                arg
                for k, v in settings.items()
                for arg in ("--set", f"state_backend.{section}.{k}={v}")
            ],
            {},
        ),
        (
            [],
            {
                f"MAPPER_STATE_STATE_BACKEND__{section.upper()}__{k.upper()}": v
                for k, v in settings.items()
            },
        ),
        (["--config", str(config)], {}),
    ]
    return found if BUDGET.full else found[:1]


def test_s3_keys_never_leak(s3_location: StoreLocation, tmp_path: Path) -> None:
    # moto's in-process server checks no signature: any key works, and each is unique
    secret = f"chaos/S3cr3t+{uuid.uuid4().hex}"
    key_id = f"AKIACHAOS{uuid.uuid4().hex[:11].upper()}"
    token = f"chaosSessionToken{uuid.uuid4().hex}"
    settings = {
        "aws_access_key_id": key_id,
        "aws_secret_access_key": secret,
        "aws_session_token": token,
        "endpoint_url": s3_location.options["endpoint_url"],
        "region": "us-east-1",
    }
    base = clean_env(MAPPER_STATE_STATE_BACKEND__URI=s3_location.uri, **DEBUG)
    captured = Captured(tmp_path)
    exercise(captured, base, ways("s3", settings, tmp_path), "chaos:secrets-s3")
    # an unreachable endpoint: the error and the debug log of its retries
    captured.run(
        ["state", "get", "x", "--set", f"state_backend.s3.aws_secret_access_key={secret}",
         "--set", f"state_backend.s3.aws_access_key_id={key_id}",
         "--set", "state_backend.s3.endpoint_url=http://127.0.0.1:9", "--lock-timeout-seconds", "3"],
        base,
    )  # fmt: skip
    # the SDK's own variables (the standard AWS chain)
    exercise(
        captured,
        {
            **base,
            "AWS_ACCESS_KEY_ID": key_id,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_SESSION_TOKEN": token,
        },
        [(["--set", f"state_backend.s3.endpoint_url={settings['endpoint_url']}"], {})],
        "chaos:secrets-s3-chain",
    )
    check(captured, s3_location, [secret, key_id, token], "s3")
    # not vacuous: the command line was kept (masked) in the lease record and history
    assert any(b"aws_secret_access_key=" in data for _, data in captured.outputs)


def test_azure_connection_string_never_leaks(azure_location: StoreLocation, tmp_path: Path) -> None:
    from tests.servers import AZURITE_KEY

    connection_string = azure_location.options["connection_string"]
    base = clean_env(MAPPER_STATE_STATE_BACKEND__URI=azure_location.uri, **DEBUG)
    captured = Captured(tmp_path)
    exercise_every_way(
        captured, base, "azure", {"connection_string": connection_string}, tmp_path,
        other=("env", {**base, "AZURE_STORAGE_CONNECTION_STRING": connection_string}, []),
    )  # fmt: skip
    check(captured, azure_location, [AZURITE_KEY], "azure", whole=(connection_string,))


@pytest.fixture
def token_server() -> Iterator[tuple[str, str]]:
    """A local OAuth token endpoint: every refresh gets the same (secret) access token."""
    access_token = f"ya29.chaos-{uuid.uuid4().hex}"

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps(
                {"access_token": access_token, "expires_in": 3600, "token_type": "Bearer"}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/token", access_token
    finally:
        server.shutdown()


def test_gcs_credentials_json_never_leaks(
    gcs_location: StoreLocation,
    fake_gcs_server: Emulator,
    tmp_path: Path,
    token_server: tuple[str, str],
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    token_uri, access_token = token_server
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    private_key_id = f"chaoskey{uuid.uuid4().hex}"
    # a service account, whose token_uri (this local server) google-auth honours; an
    # authorized_user's token_uri is ignored for Google's own endpoint
    credentials = {
        "type": "service_account",
        "project_id": "chaos",
        "private_key_id": private_key_id,
        "private_key": private_key,
        "client_email": "chaos@chaos.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": token_uri,
    }
    key_body = "".join(private_key.splitlines()[1:-1])  # the base64 of the key, without armour
    text = json.dumps(credentials)
    path = tmp_path / "credentials.json"
    path.write_text(text)
    path.chmod(0o600)
    base = clean_env(
        MAPPER_STATE_STATE_BACKEND__URI=gcs_location.uri,
        STORAGE_EMULATOR_HOST=fake_gcs_server.endpoint,
        **DEBUG,
    )
    captured = Captured(tmp_path)
    exercise_every_way(
        captured, base, "gcs", {"application_credentials_json": text}, tmp_path,
        other=("path", base, ["--set", f"state_backend.gcs.application_credentials_path={path}"]),
    )  # fmt: skip
    check(
        captured, gcs_location, [key_body[:64], key_body[-64:], private_key_id, access_token], "gcs"
    )


def test_a_password_in_a_uri_never_leaks(tmp_path: Path, pg_location: PostgresLocation) -> None:
    password = f"pw-chaos-{uuid.uuid4().hex}"
    captured = Captured(tmp_path)
    # nothing answers at these addresses: a short lease keeps each run's retries to ~1 s
    env = clean_env(**DEBUG, MAPPER_STATE_STATE_BACKEND__LOCK_TIMEOUT_SECONDS="3")
    for uri in (
        f"postgresql://etl:{password}@127.0.0.1:1/meltano",
        f"s3://etl:{password}@bucket/prefix",
        f"file://etl:{password}@{tmp_path}/x",
    ):
        for args in (
            ["state", "get", "x"],
            ["--state-id", "x"],
            ["lock", "status", "x"],
            ["--about"],
        ):
            captured.run([*args, "--state-backend-uri", uri], env)
            captured.run(args, {**env, "MAPPER_STATE_STATE_BACKEND__URI": uri})
            captured.run(args, {**env, "MELTANO_STATE_BACKEND_URI": uri})
    # a holder whose URI carries the server's real password, its lease record inspected
    server = pg_location.server
    secret = server.password
    uri = pg_location.uri.replace(f"//{server.user}@", f"//{server.user}:{secret}@", 1)
    assert secret in uri
    holder = cli.spawn(
        None,  # type: ignore[arg-type]
        "--state-id", "held", "--state-backend-uri", uri, env=env, cwd=tmp_path,
    )  # fmt: skip
    store = pg_location.open()
    try:
        wait_until(
            lambda: store.read(f"held/{cli.LEASE_FILE}") is not None, "the lease", timeout=30
        )
        rows = [(key, blob.data) for key in store.list() if (blob := store.read(key))]
    finally:
        out, err = holder.communicate(b"", timeout=60)
        captured.add(["holder"], out + err)
        store.close()
    found = leaks([password], [(" ".join(a[:3]), d) for a, d in captured.outputs])
    found += leaks([secret], [("holder", out + err), *rows])
    assert any(cli.LEASE_FILE in key for key, _ in rows), "no lease record was inspected"
    assert not found, found


def _exists(store: Any, key: str) -> bool:
    return store.read(key) is not None


def test_a_long_postgres_password_never_leaks(
    tmp_path: Path, pg_location: PostgresLocation
) -> None:
    """A real password well past 20 characters, given as libpq's ``password`` parameter of
    the URI and as its user-info: no piece of it in the holders' output, nor in any row
    they wrote (the lease records keep their command lines, the states, the history)."""
    server = pg_location.server
    role = f"etl_{uuid.uuid4().hex[:8]}"
    password = f"pw-long-{uuid.uuid4().hex}"
    server.create_role(role, password, "ALTER ROLE {role} SUPERUSER")
    plain = server.uri(pg_location.table, user=role)
    uris = (
        server.uri(pg_location.table, user=role, password=password),
        plain.replace(f"//{role}@", f"//{role}:{password}@", 1),
    )
    env = clean_env(**DEBUG)
    store = pg_location.open()
    outputs: list[tuple[str, bytes]] = []
    try:
        for i, uri in enumerate(uris):
            sid = f"long-password-{i}"
            lease_key = f"{sid}/{cli.LEASE_FILE}"
            holder = cli.spawn(
                None,  # type: ignore[arg-type]
                "--state-id", sid, "--state-backend-uri", uri, env=env, cwd=tmp_path,
            )  # fmt: skip
            try:
                wait_until(partial(_exists, store, lease_key), "the lease", timeout=30)
                rows = [(key, blob.data) for key in store.list() if (blob := store.read(key))]
            finally:
                out, err = holder.communicate(b'{"type": "STATE", "value": {"n": 1}}\n', timeout=60)
            assert holder.returncode == 0, err.decode(errors="replace")
            assert any(key == lease_key for key, _ in rows), "no lease record was inspected"
            outputs += [(f"holder {i}", out + err), *rows]
        outputs += [(key, blob.data) for key in store.list() if (blob := store.read(key))]
    finally:
        store.close()
    found = leaks([password], outputs)
    assert not found, found
