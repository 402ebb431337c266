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
from dataclasses import dataclass

import pytest

from tests.chaos import cli
from tests.chaos.conftest import EXIT_MARGIN
from tests.helpers import clean_env
from tests.support.cli import one_line_error

pytestmark = pytest.mark.cloud


@dataclass
class StallingServer:
    url: str
    arrivals: list[float]  # when each request was read (Unix time)


@pytest.fixture
def stalling_s3() -> Iterator[StallingServer]:
    """An HTTP endpoint answering every request ``200`` with an ETag, then never the body."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    held: list[socket.socket] = []
    server = StallingServer(f"http://127.0.0.1:{listener.getsockname()[1]}", [])

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
            conn.recv(65536)
            server.arrivals.append(time.time())
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b'ETag: "0123456789abcdef0123456789abcdef"\r\nContent-Length: 1000\r\n\r\n{"'
            )  # then nothing: the body stalls

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_a_stalled_body_is_a_store_error_within_the_deadline(
    stalling_s3: StallingServer,
) -> None:
    """Timed from the first request's arrival to the process's exit (TTL 6 s: deadline 2 s)."""
    env = clean_env(
        MAPPER_STATE_STATE_BACKEND__URI="s3://bucket/prefix",
        MAPPER_STATE_STATE_BACKEND__S3__ENDPOINT_URL=stalling_s3.url,
        MAPPER_STATE_STATE_BACKEND__S3__AWS_ACCESS_KEY_ID="testing",
        MAPPER_STATE_STATE_BACKEND__S3__AWS_SECRET_ACCESS_KEY="testing-secret",
        MAPPER_STATE_STATE_BACKEND__S3__REGION="us-east-1",
    )
    proc = cli.run(None, "state", "get", "x", "--lock-timeout-seconds", "6", env=env, timeout=60)  # type: ignore[arg-type]
    ended = time.time()
    assert proc.returncode == 5, proc.stderr.decode(errors="replace")
    one_line_error(proc.stderr)
    assert stalling_s3.arrivals, "no request reached the server"
    took = ended - stalling_s3.arrivals[0]
    assert took < 2 + EXIT_MARGIN, (
        f"gave up {took:.1f}s after its first request (deadline 2 s, exit margin {EXIT_MARGIN} s)"
    )
