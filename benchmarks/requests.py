"""Requests to an S3 store per run: mapper-state against Meltano's S3 state backend.

SPEC section 5 asks for few requests: per run one lease acquire, one state read, one
write per checkpoint, renewals and one release. This script counts them on the wire.
It starts moto's S3 in server mode on 127.0.0.1 with a small counting HTTP proxy in
front of it, points each tool at the proxy, and records every request as its method
and the kind of key it touches (``GET state.json``, ``PUT lease``, ``DELETE lock``,
``LIST history/``...). Scenarios, each on a fresh prefix of one bucket:

* ``mapper-state`` as a filter over a generated Singer stream of 1,000 records with a
  STATE every 100 records, fed at full speed and with 0.2 s between STATEs, with
  ``--checkpoint-interval-seconds 0`` and the default 5 s;
* ``mapper-state run`` with the tiny tap and target of the test suite (10 records
  0.2 s apart, a STATE after each, every one confirmed by the target), both intervals;
* Meltano 4.4 (``.tools/meltano``, when installed) with its S3 state backend:
  ``meltano state set`` once, and ``meltano run tap-sample target-jsonl`` on a
  throw-away copy of this project (1,000 rows, a STATE every 100) — and the same
  run with mapper-state's ``remote-state`` mapping in the middle, whose lease is kept
  by a detached keeper until Meltano exits (both tools' requests are counted).

Run ``.venv/bin/python benchmarks/requests.py`` (``make bench`` runs it too). The
table prints as Markdown and goes to ``benchmarks/results/requests.md``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

# Run as a script, this file's directory leads sys.path, where this file's name would
# shadow the `requests` package that moto imports.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

ROOT = _HERE.parent
BIN = Path(sys.executable).parent
MAPPER = str(BIN / "mapper-state")
TAP_SAMPLE = BIN / "tap-sample"
MELTANO = ROOT / ".tools" / "meltano" / "bin" / "meltano"
TARGET_JSONL = ROOT / ".tools" / "target-jsonl" / "bin" / "target-jsonl"
FIXTURES = ROOT / "tests" / "fixtures"
BUCKET = "bench"
REGION = "us-east-1"
KEY_ID, SECRET = "testing", "testing-secret"
RECORDS, STATE_EVERY = 1_000, 100
RUN_RECORDS = 10  # the tiny tap emits a STATE after each record
PACE = 0.2  # seconds between STATEs in the paced scenarios
VERBOSE = bool(os.environ.get("BENCH_REQUESTS_VERBOSE"))  # print each run's requests in order
TIMEOUT = 60  # seconds, per child process

# -- the counting proxy ------------------------------------------------------------

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
}


def key_kind(key: str) -> str:
    """What a key is, without the prefix and the state ID."""
    name = key.rsplit("/", 1)[-1]
    if "/history/" in f"/{key}":
        return "history"
    if name == "mapper-state.lease.json":
        return "lease"
    return name or "prefix"  # state.json, lock (Meltano's), ...


def classify(method: str, target: str, body: bytes) -> str:
    """``METHOD kind`` for one path-style S3 request, e.g. ``PUT lease``."""
    parts = urlsplit(target)
    bucket_and_key = unquote(parts.path).lstrip("/").split("/", 1)
    key = bucket_and_key[1] if len(bucket_and_key) > 1 else ""
    query = parse_qs(parts.query, keep_blank_values=True)
    if not key:  # a bucket request
        if method == "GET" and ("list-type" in query or "prefix" in query):
            prefix = query.get("prefix", [""])[0]
            kind = "history/" if prefix.rstrip("/").endswith("/history") else "all"
            return f"LIST {kind}"
        if method == "POST" and "delete" in query:  # DeleteObjects: the keys are in the body
            keys = [k.decode() for k in re.findall(rb"<Key>([^<]*)</Key>", body)]
            kinds = sorted({key_kind(k) for k in keys}) or ["nothing"]
            return f"DELETE {'+'.join(kinds)} (batch)"
        return f"{method} bucket"
    kind = key_kind(key)
    if method == "POST" and "uploads" in query:
        return f"PUT {kind} (multipart start)"
    if method == "PUT" and "partNumber" in query:
        return f"PUT {kind} (multipart part)"
    if method == "POST" and "uploadId" in query:
        return f"PUT {kind} (multipart complete)"
    if method == "DELETE" and "uploadId" in query:
        return f"PUT {kind} (multipart abort)"
    return f"{method} {kind}"


class CountingProxy(ThreadingHTTPServer):
    """An HTTP proxy on 127.0.0.1 in front of one upstream port that logs each request."""

    daemon_threads = True

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.requests: list[str] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.port = int(self.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join()

    def take(self) -> list[str]:
        """The requests logged since the last call."""
        with self.lock:
            taken, self.requests = self.requests, []
        return taken


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs expect
    server: CountingProxy

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self) -> None:
        body = self._body()
        with self.server.lock:
            self.server.requests.append(classify(self.command, self.path, body))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=30)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        if self.command == "HEAD":
            length = response.getheader("Content-Length")
            if length is not None:
                self.send_header("Content-Length", length)
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


# -- the store ---------------------------------------------------------------------


class StoreCheck:
    """Reads a stored state straight from moto (not through the proxy) to check a run."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __call__(self, prefix: str, state_id: str, singer_state: Any = None) -> None:
        key = f"{prefix}/{state_id}/state.json"
        try:
            document = json.loads(self.client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        except self.client.exceptions.NoSuchKey:
            raise SystemExit(f"no state was stored at s3://{BUCKET}/{key}") from None
        stored = document.get("completed", {}).get("singer_state")
        if singer_state is not None and stored != singer_state:
            raise SystemExit(f"s3://{BUCKET}/{key} holds {stored}, expected {singer_state}")


@contextlib.contextmanager
def moto_with_proxy() -> Iterator[tuple[CountingProxy, StoreCheck]]:
    """moto's S3 on 127.0.0.1 with the bucket created, behind a counting proxy."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        client = boto3.client(
            "s3",
            endpoint_url=f"http://{host}:{port}",
            region_name=REGION,
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
        )
        client.create_bucket(Bucket=BUCKET)
        with CountingProxy(port) as proxy:
            yield proxy, StoreCheck(client)
    finally:
        server.stop()


# -- scenarios ---------------------------------------------------------------------


@dataclass
class Result:
    tool: str
    scenario: str
    states_in: str
    requests: list[str]
    seconds: float


def base_env(work: Path) -> dict[str, str]:
    """The environment without any settings of ours, Meltano's or AWS's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MAPPER_STATE_", "MELTANO_", "AWS_", "TAP_", "TARGET_"))
    }
    missing = str(work / "no-aws-config")
    env.update(
        AWS_CONFIG_FILE=missing,
        AWS_SHARED_CREDENTIALS_FILE=missing,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_DEFAULT_REGION=REGION,
    )
    return env


def mapper_env(work: Path, proxy: CountingProxy) -> dict[str, str]:
    env = base_env(work)
    section = "MAPPER_STATE_STATE_BACKEND__S3__"
    env.update(
        {
            f"{section}ENDPOINT_URL": proxy.endpoint,
            f"{section}AWS_ACCESS_KEY_ID": KEY_ID,
            f"{section}AWS_SECRET_ACCESS_KEY": SECRET,
            f"{section}REGION": REGION,
        }
    )
    return env


def meltano_env(work: Path, proxy: CountingProxy, prefix: str) -> dict[str, str]:
    env = base_env(work)
    env.update(
        MELTANO_SEND_ANONYMOUS_USAGE_STATS="false",
        MELTANO_CLI_DISABLE_VERSION_CHECK="true",
        MELTANO_STATE_BACKEND_URI=f"s3://{BUCKET}/{prefix}",
        MELTANO_STATE_BACKEND_S3_ENDPOINT_URL=proxy.endpoint,
        MELTANO_STATE_BACKEND_S3_AWS_ACCESS_KEY_ID=KEY_ID,
        MELTANO_STATE_BACKEND_S3_AWS_SECRET_ACCESS_KEY=SECRET,
    )
    return env


def run(
    args: list[str], *, cwd: Path, env: dict[str, str], feed: list[bytes] | None = None
) -> float:
    """Run a child to completion; ``feed`` is written to its stdin, PACE seconds between chunks."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if feed else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            if feed:
                assert child.stdin is not None
                for i, chunk in enumerate(feed):
                    if i:
                        time.sleep(PACE)
                    child.stdin.write(chunk)
                    child.stdin.flush()
                child.stdin.close()
            child.wait(timeout=TIMEOUT)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        if child.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-3000:]
            raise SystemExit(f"{' '.join(args[:3])}... exited {child.returncode}:\n{tail}")
    return time.perf_counter() - started


def generate_stream() -> list[bytes]:
    """RECORDS records with a STATE after every STATE_EVERY, in chunks that end on a STATE."""
    chunks = []
    lines = [
        '{"type":"SCHEMA","stream":"events","schema":{"type":"object"},"key_properties":["id"]}'
    ]
    for i in range(1, RECORDS + 1):
        lines.append(f'{{"type":"RECORD","stream":"events","record":{{"id":{i}}}}}')
        if i % STATE_EVERY == 0:
            lines.append(f'{{"type":"STATE","value":{{"bookmarks":{{"events":{{"id":{i}}}}}}}}}')
            chunks.append(("\n".join(lines) + "\n").encode())
            lines = []
    return chunks


def mapper_scenarios(work: Path, proxy: CountingProxy, check: StoreCheck) -> list[Result]:
    env = mapper_env(work, proxy)
    chunks = generate_stream()
    results = []
    for paced, interval in ((False, "5"), (False, "0"), (True, "5"), (True, "0")):
        prefix = f"filter-{'paced' if paced else 'fast'}-{interval}"
        proxy.take()
        seconds = run(
            [
                MAPPER,
                "--state-id",
                "bench:filter",
                "--state-backend-uri",
                f"s3://{BUCKET}/{prefix}",
                "--checkpoint-interval-seconds",
                interval,
            ],
            cwd=work,
            env=env,
            feed=chunks if paced else [b"".join(chunks)],
        )
        check(prefix, "bench:filter", {"bookmarks": {"events": {"id": RECORDS}}})
        speed = f"{PACE:g} s between STATEs" if paced else "at full speed"
        scenario = f"filter, {RECORDS:,} records {speed}, checkpoint interval {interval} s"
        scenario += " (default)" if interval == "5" else ""
        results.append(Result("mapper-state", scenario, str(len(chunks)), proxy.take(), seconds))
    run_env = {**env, "TINY_TAP_COUNT": str(RUN_RECORDS), "TINY_TAP_SLEEP": str(PACE)}
    for interval in ("5", "0"):
        prefix = f"run-{interval}"
        proxy.take()
        seconds = run(
            [
                MAPPER,
                "run",
                "--state-id",
                "bench:run",
                "--state-backend-uri",
                f"s3://{BUCKET}/{prefix}",
                "--checkpoint-interval-seconds",
                interval,
                "--tap",
                f"{sys.executable} {FIXTURES / 'tiny_tap.py'}",
                "--target",
                f"{sys.executable} {FIXTURES / 'tiny_target.py'} {work / f'{prefix}.out'}",
            ],
            cwd=work,
            env=run_env,
        )
        check(prefix, "bench:run", {"bookmarks": {"s": RUN_RECORDS}})
        scenario = (
            f"`run`, tiny tap and target, {RUN_RECORDS} records {PACE:g} s apart, "
            f"checkpoint interval {interval} s"
        ) + (" (default)" if interval == "5" else "")
        results.append(
            Result("mapper-state", scenario, f"{RUN_RECORDS}, all confirmed", proxy.take(), seconds)
        )
    return results


def meltano_project(work: Path) -> Path:
    """A throw-away copy of this project's meltano.yml, its plugins linked in, 1,000 rows."""
    project = work / "meltano-project"
    (project / "examples" / "data").mkdir(parents=True)
    shutil.copy(ROOT / "meltano.yml", project / "meltano.yml")
    for tree in (".venv", ".tools"):  # the plugins' executables are relative to the root
        (project / tree).symlink_to(ROOT / tree, target_is_directory=True)
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "generate_data.py"),
            "--rows",
            str(RECORDS),
            "--seed",
            "1",
            "--file",
            str(project / "examples" / "data" / "events.jsonl"),
        ],
        check=True,
        capture_output=True,
    )
    return project


def tap_states(project: Path, work: Path) -> int:
    """How many STATE messages tap-sample emits over the project's data file."""
    config = work / "tap-sample.json"
    config.write_text(
        json.dumps(
            {
                "data_path": str(project / "examples" / "data" / "events.jsonl"),
                "state_message_frequency": STATE_EVERY,
            }
        )
    )
    out = subprocess.run(
        [str(TAP_SAMPLE), "--config", str(config)],
        capture_output=True,
        check=True,
        timeout=TIMEOUT,
        env=base_env(work),
    ).stdout
    return sum(1 for line in out.splitlines() if b'"type":"STATE"' in line.replace(b" ", b""))


def wait_for(proxy: CountingProxy, kind: str, seen: list[str], timeout: float = 20) -> None:
    """Collect requests into ``seen`` until one of ``kind`` arrives (a detached keeper's)."""
    deadline = time.monotonic() + timeout
    while kind not in seen and time.monotonic() < deadline:
        time.sleep(0.1)
        seen += proxy.take()
    if kind not in seen:
        raise SystemExit(f"no {kind} request within {timeout:g} s")
    time.sleep(0.5)  # nothing is expected after it; catch a straggler if there is one
    seen += proxy.take()


def meltano_scenarios(work: Path, proxy: CountingProxy, check: StoreCheck) -> list[Result]:
    project = meltano_project(work)
    meltano = [str(MELTANO), "--log-level=warning"]
    results = []

    prefix, state = "meltano-set", {"bookmarks": {"events": {"id": 1}}}
    proxy.take()
    seconds = run(
        [*meltano, "state", "set", "--force", "dev:bench", json.dumps({"singer_state": state})],
        cwd=project,
        env=meltano_env(work, proxy, prefix),
    )
    check(prefix, "dev:bench", state)
    results.append(Result("Meltano 4.4", "`meltano state set`", "1", proxy.take(), seconds))

    states = f"{tap_states(project, work)} from the tap, 1 confirmed by target-jsonl"
    for prefix, scenario, plugins in (
        ("meltano-run", f"`meltano run tap-sample target-jsonl`, {RECORDS:,} rows", []),
        (
            "meltano-mapping",
            f"`meltano run tap-sample remote-state target-jsonl`, {RECORDS:,} rows: "
            "mapper-state's lease (lock_only) kept until Meltano exits",
            ["remote-state"],
        ),
    ):
        env = {
            **meltano_env(work, proxy, prefix),
            "TAP_SAMPLE_STATE_MESSAGE_FREQUENCY": str(STATE_EVERY),
        }
        proxy.take()
        seconds = run(
            [*meltano, "run", "tap-sample", *plugins, "target-jsonl"], cwd=project, env=env
        )
        seen = proxy.take()
        if plugins:
            wait_for(proxy, "DELETE lease", seen)  # the keeper releases after Meltano exits
        check(prefix, "dev:tap-sample-to-target-jsonl")
        tool = "Meltano 4.4 + mapper-state" if plugins else "Meltano 4.4"
        results.append(Result(tool, scenario, states, seen, seconds))
    return results


# -- report ------------------------------------------------------------------------

_ORDER = ("GET", "HEAD", "PUT", "POST", "DELETE", "LIST")


def _shown(kind: str) -> str:
    """The three requests of a multipart upload count under one name."""
    return re.sub(r"\(multipart \w+\)", "(multipart)", kind)


def _sort_key(kind: str) -> tuple[int, str]:
    verb = kind.split(" ", 1)[0]
    return (_ORDER.index(verb) if verb in _ORDER else len(_ORDER), kind)


def table(results: list[Result]) -> str:
    lines = [
        "| tool | scenario | STATE messages | requests | state.json writes | breakdown |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        counts = Counter(_shown(k) for k in r.requests)
        writes = r.requests.count("PUT state.json") + r.requests.count(
            "PUT state.json (multipart complete)"
        )
        breakdown = ", ".join(f"{k} {counts[k]}" for k in sorted(counts, key=_sort_key))
        lines.append(
            f"| {r.tool} | {r.scenario} | {r.states_in} | **{len(r.requests)}** | {writes} "
            f"| {breakdown} |"
        )
    lines += [
        "",
        "Requests counted at an HTTP proxy in front of moto's S3, each as its method and",
        "the kind of key: `state.json`; `lease` is mapper-state's",
        "`<state_id>/mapper-state.lease.json`, `lock` Meltano's `<state_id>/lock`,",
        "`history` a run's snapshot under `<state_id>/history/` (`history_keep`, default",
        "20); `LIST history/` lists those snapshots. `(multipart)` requests are",
        "smart_open's uploads (start, part, complete: 3 requests per object written);",
        "`(batch)` is a DeleteObjects request. mapper-state's lease TTL is the default",
        "30 s, renewed every 10 s and before each state write (fencing). With a",
        "checkpoint interval of 0 a state is written whenever the previous write is done:",
        "states that arrive meanwhile (or while mapper-state starts) are coalesced.",
        "In the last row, `lease` requests and one `GET state.json` are mapper-state's,",
        "the rest Meltano's.",
    ]
    return "\n".join(lines)


def main() -> int:
    if not Path(MAPPER).exists():
        print(f"requests: {MAPPER} is missing (make setup)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="mapper-state-requests-"))
    results: list[Result] = []
    try:
        with moto_with_proxy() as (proxy, check):
            results += mapper_scenarios(work, proxy, check)
            if MELTANO.exists() and TARGET_JSONL.exists() and TAP_SAMPLE.exists():
                results += meltano_scenarios(work, proxy, check)
            else:
                print(
                    "requests: Meltano, tap-sample or target-jsonl is not installed "
                    "(scripts/install-tools.sh): Meltano rows skipped",
                    file=sys.stderr,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if VERBOSE:
        for r in results:
            print(f"{r.tool}, {r.scenario} ({r.seconds:.1f} s):", file=sys.stderr)
            for kind in r.requests:
                print(f"  {kind}", file=sys.stderr)
    text = table(results)
    print(text)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "requests.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
