"""Requests and time of the operator commands that read many states, on S3 (moto).

``state list`` should cost list pages in proportion to the state IDs, not to the
length of their history; ``state export`` (and ``list --long``) fetch states
concurrently, in the order they print. This script fills a bucket on moto with N
state IDs, each with M history snapshots (in the history's place, or with
``--history-place old`` in ``<ID>/history/`` where earlier versions kept them), then
times each command run through the real CLI and counts the requests moto serves
(every request, by kind: LIST, GET, PUT, DELETE). With ``--meltano`` it runs
Meltano's ``state list`` and ``state export`` on the same bucket too.

    .venv/bin/python benchmarks/state_commands.py --ids 5000 --snapshots 5 --meltano

``--mapper "before=python -c ..."`` also runs another mapper-state (e.g. an older
checkout on ``PYTHONPATH``) against the same bucket, for before/after figures. The "moto CPU"
column is the CPU time moto spent serving the command: moto answers from one Python
process (and dispatches each request under one lock), so it bounds how much a
client's concurrency can gain on this emulator.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

# Run as a script, this file's directory leads sys.path, where benchmarks/requests.py
# would shadow the `requests` package that moto imports.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

ROOT = _HERE.parent
BIN = Path(sys.executable).parent
MELTANO = ROOT / ".tools" / "meltano" / "bin" / "meltano"
BUCKET = "fleet"
PREFIX = "states"
REGION = "us-east-1"
KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing-secret"}

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Counting:
    """WSGI middleware in front of moto: counts the S3 requests by kind."""

    def __init__(self, app: WsgiApp) -> None:
        self.app = app
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if not path.startswith("/moto-api"):
            method = environ["REQUEST_METHOD"]
            query = parse_qs(environ.get("QUERY_STRING", ""))
            kind = "LIST" if method == "GET" and "list-type" in query else method
            with self._lock:
                self.counts[kind] += 1
        return self.app(environ, start_response)

    def take(self) -> Counter[str]:
        with self._lock:
            counts, self.counts = self.counts, Counter()
        return counts


def start_moto() -> tuple[str, Counting]:
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = Counting(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    return f"http://{host}:{port}", app


def fill(endpoint: str, ids: int, snapshots: int, place: str) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        config=Config(max_pool_connections=32),
        **KEYS,
    )
    client.create_bucket(Bucket=BUCKET)

    def one(n: int) -> None:
        state_id = f"prod:tap-{n:05d}-to-target-jsonl"
        value = {"bookmarks": {"users": {"replication_key_value": f"2024-01-01T00:{n % 60:02d}"}}}
        doc = {"completed": {"singer_state": value}, "partial": {}}
        client.put_object(
            Bucket=BUCKET, Key=f"{PREFIX}/{state_id}/state.json", Body=json.dumps(doc)
        )
        for s in range(snapshots):
            name = f"202401{s + 1:02d}T000000.000000Z-run{s}"
            where = f"{state_id}/history" if place == "old" else f".mapper-state/history/{state_id}"
            snap = {"state_id": state_id, "run_id": f"run{s}", "singer_state": value}
            client.put_object(
                Bucket=BUCKET, Key=f"{PREFIX}/{where}/{name}.json", Body=json.dumps(snap)
            )

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(one, range(ids)))


def env_for(endpoint: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MAPPER_STATE_", "MELTANO_", "AWS_"))
    }
    env.update(
        MAPPER_STATE_STATE_BACKEND__URI=f"s3://{BUCKET}/{PREFIX}",
        MAPPER_STATE_STATE_BACKEND__S3__ENDPOINT_URL=endpoint,
        MAPPER_STATE_STATE_BACKEND__S3__REGION=REGION,
        MAPPER_STATE_STATE_BACKEND__S3__AWS_ACCESS_KEY_ID=KEYS["aws_access_key_id"],
        MAPPER_STATE_STATE_BACKEND__S3__AWS_SECRET_ACCESS_KEY=KEYS["aws_secret_access_key"],
    )
    return env


def meltano_project(endpoint: str, root: Path) -> Path:
    project = root / "meltano"
    project.mkdir()
    (project / "meltano.yml").write_text(
        json.dumps(
            {
                "default_environment": "dev",
                "project_id": "00000000-0000-4000-8000-000000000000",
                "send_anonymous_usage_stats": False,
                "environments": [{"name": "dev"}],
                "state_backend": {
                    "uri": f"s3://{BUCKET}/{PREFIX}",
                    "s3": {**KEYS, "endpoint_url": endpoint},
                },
            }
        )
    )
    return project


def timed(
    label: str, argv: list[str], env: dict[str, str], cwd: Path, counts: Counting
) -> dict[str, Any]:
    counts.take()
    started = time.perf_counter()
    server_cpu = time.process_time()  # moto serves from this process's threads
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=False)
    seconds = time.perf_counter() - started
    server_cpu = time.process_time() - server_cpu
    taken = counts.take()
    if proc.returncode not in (0, 12):
        sys.exit(f"{label} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    lines = proc.stdout.count(b"\n")
    return {
        "command": label,
        "seconds": round(seconds, 2),
        "server_cpu": round(server_cpu, 2),
        "lines": lines,
        **taken,
    }


def scenarios(
    args: argparse.Namespace, endpoint: str, counts: Counting
) -> Iterator[dict[str, Any]]:
    mappers = [("mapper-state", [str(BIN / "mapper-state")])]
    for given in args.mapper or ():
        label, _, command = given.partition("=")
        mappers.append((label, shlex.split(command)))
    env = env_for(endpoint)
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for label, mapper in mappers:
            for what in (["list"], ["export"], *([["list", "--long"]] if args.long else [])):
                yield timed(
                    f"{label} state {' '.join(what)}", [*mapper, "state", *what], env, cwd, counts
                )
        if args.meltano and MELTANO.exists():
            project = meltano_project(endpoint, cwd)
            menv = {
                **{k: v for k, v in os.environ.items() if not k.startswith(("MELTANO_", "AWS_"))},
                "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false",
                "MELTANO_CLI_DISABLE_VERSION_CHECK": "true",
            }
            for what in ("list", "export"):
                yield timed(
                    f"meltano state {what}",
                    [str(MELTANO), "--log-level=warning", "state", what],
                    menv,
                    project,
                    counts,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=5000)
    parser.add_argument("--snapshots", type=int, default=5)
    parser.add_argument("--history-place", choices=["new", "old"], default="new")
    parser.add_argument(
        "--mapper",
        action="append",
        metavar="LABEL=COMMAND",
        help="also measure another mapper-state command line (repeatable)",
    )
    parser.add_argument("--long", action="store_true", help="also time `state list --long`")
    parser.add_argument("--meltano", action="store_true", help="also time Meltano's commands")
    args = parser.parse_args()
    endpoint, counts = start_moto()
    started = time.perf_counter()
    fill(endpoint, args.ids, args.snapshots, args.history_place)
    print(
        f"{args.ids} state IDs x {args.snapshots} snapshots ({args.history_place} place) "
        f"filled in {time.perf_counter() - started:.0f}s",
        file=sys.stderr,
    )
    print("| command | seconds | moto CPU s | LIST | GET | other requests |")
    print("|---|---|---|---|---|---|")
    for row in scenarios(args, endpoint, counts):
        other = sum(v for k, v in row.items() if k in ("PUT", "DELETE", "HEAD", "POST"))
        print(
            f"| {row['command']} | {row['seconds']} | {row['server_cpu']} | {row.get('LIST', 0)} | "
            f"{row.get('GET', 0)} | {other} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
