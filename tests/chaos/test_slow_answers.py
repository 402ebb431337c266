"""An answer whose headers arrive but whose body stalls: a store error, retried within the
deadline, never an internal error.

A loaded or failing server (or a proxy in between) can send a response's status and headers
and then stop. The S3 store reads the body itself, so the SDK does not wrap that timeout:
found when 8 holders raced on a loaded machine (one died of ``urllib3 ReadTimeoutError`` in
the middle of a takeover). A server that always stalls shows it every time.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.chaos import cli
from tests.chaos.conftest import startup_margin
from tests.helpers import clean_env

pytestmark = pytest.mark.cloud


@pytest.fixture
def stalling_s3() -> Iterator[str]:
    """An HTTP endpoint answering every request ``200`` with an ETag, then never the body;
    a request for a key under ``refused/`` is answered ``403`` at once."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
            request = conn.recv(65536)
            if b"/refused/" in request.split(b"\r\n", 1)[0]:
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                continue
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b'ETag: "0123456789abcdef0123456789abcdef"\r\nContent-Length: 1000\r\n\r\n{"'
            )  # then nothing: the body stalls

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_a_stalled_body_is_a_store_error_within_the_deadline(stalling_s3: str) -> None:
    env = clean_env(
        MAPPER_STATE_STATE_BACKEND__URI="s3://bucket/prefix",
        MAPPER_STATE_STATE_BACKEND__S3__ENDPOINT_URL=stalling_s3,
        MAPPER_STATE_STATE_BACKEND__S3__AWS_ACCESS_KEY_ID="testing",
        MAPPER_STATE_STATE_BACKEND__S3__AWS_SECRET_ACCESS_KEY="testing-secret",
        MAPPER_STATE_STATE_BACKEND__S3__REGION="us-east-1",
    )
    margin = startup_margin(
        lambda: cli.run(None, "state", "get", "refused", "--lock-timeout-seconds", "6", env=env)  # type: ignore[arg-type]
    )
    started = time.monotonic()
    proc = cli.run(None, "state", "get", "x", "--lock-timeout-seconds", "6", env=env, timeout=60)  # type: ignore[arg-type]
    took = time.monotonic() - started
    assert proc.returncode == 5, proc.stderr.decode(errors="replace")
    cli.one_line_error(proc.stderr)
    assert took < 2 + margin, f"gave up after {took:.1f}s (deadline 2 s, start-up {margin:.1f} s)"
