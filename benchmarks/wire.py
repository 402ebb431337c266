"""S3 on the wire: moto's server with a real mitmproxy in front of it that logs every request.

The tools under test talk to the proxy (``Wire.endpoint``); the benchmark itself seeds
and checks the bucket straight at moto, so its own requests are never counted. The
proxy is ``tests.proxy.FaultProxy`` (``mitmdump`` in reverse-proxy mode with the addon
of ``tests/proxy/faults.py``) with no fault configured: count only. Each logged
request is classified as its method and the kind of key it touches (``GET state.json``,
``PUT lease``, ``LIST history/``...), with the prefix and the state ID left out.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from benchmarks.common import BenchError, clean_env

REGION = "us-east-1"
KEY_ID, SECRET = "testing", "testing-secret"
LEASE_NAME = "mapper-state.lease.json"


def key_kind(key: str) -> str:
    """What a key is, without the prefix and the state ID."""
    name = key.rsplit("/", 1)[-1]
    if "/.mapper-state/runs/" in f"/{key}":
        return "run record"
    if "/history/" in f"/{key}":
        return "history"
    if name == LEASE_NAME:
        return "lease"
    return name or "prefix"  # state.json, lock (Meltano's), ...


def classify(entry: dict[str, Any]) -> str:
    """``METHOD kind`` for one logged path-style S3 request, e.g. ``PUT lease``."""
    method = str(entry["method"])
    bucket_and_key = unquote(str(entry["path"])).lstrip("/").split("/", 1)
    key = bucket_and_key[1] if len(bucket_and_key) > 1 else ""
    query = parse_qs(str(entry.get("query") or ""), keep_blank_values=True)
    if not key:  # a bucket request
        if method == "GET" and ("list-type" in query or "prefix" in query):
            prefix = query.get("prefix", [""])[0]
            kind = "history/" if prefix.rstrip("/").endswith("/history") else "prefix"
            if "/.mapper-state/runs" in f"/{prefix}":
                kind = "run records"
            return f"LIST {kind}"
        if method == "POST" and "delete" in query:
            return "DELETE (batch)"
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


def state_id_of(entry: dict[str, Any], prefix: str) -> str | None:
    """The state ID a request's key (or listing prefix) belongs to, under ``prefix``."""
    path = unquote(str(entry["path"])).lstrip("/")
    _, _, key = path.partition("/")
    if not key:
        listed = parse_qs(str(entry.get("query") or "")).get("prefix", [""])[0]
        key = listed
    head = f"{prefix.strip('/')}/"
    if not key.startswith(head):
        return None
    rest = key[len(head) :]
    for marker in ("/history/", f"/{LEASE_NAME}", "/state.json", "/lock"):
        if marker in f"{rest}":
            return rest.split(marker, 1)[0] or None
    return rest.rstrip("/") or None


def shown(kind: str) -> str:
    """The three requests of a multipart upload count under one name."""
    return re.sub(r"\(multipart \w+\)", "(multipart)", kind)


_ORDER = ("GET", "HEAD", "PUT", "POST", "DELETE", "LIST")


def breakdown(kinds: Iterable[str]) -> str:
    """``GET lease 1, PUT state.json 2, ...`` in a stable order."""
    counts = Counter(shown(k) for k in kinds)

    def order(kind: str) -> tuple[int, str]:
        verb = kind.split(" ", 1)[0]
        return (_ORDER.index(verb) if verb in _ORDER else len(_ORDER), kind)

    return ", ".join(f"{k} {counts[k]}" for k in sorted(counts, key=order))


def state_writes(kinds: Sequence[str]) -> int:
    return sum(1 for k in kinds if k in ("PUT state.json", "PUT state.json (multipart complete)"))


@dataclass
class Wire:
    """A running moto and its counting proxy."""

    direct: str  # moto itself: for seeding and checking, not counted
    proxy: Any  # tests.proxy.FaultProxy
    _taken: int = 0

    @property
    def endpoint(self) -> str:
        """Where the tools under test send their requests."""
        return str(self.proxy.url)

    def client(self) -> Any:
        """A boto3 client straight at moto (the benchmark's own requests are not counted)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.direct,
            region_name=REGION,
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
            config=Config(max_pool_connections=32),
        )

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)

    def log(self) -> list[dict[str, Any]]:
        """Every request the proxy has logged so far."""
        return list(self.proxy.requests())

    def take(self) -> list[dict[str, Any]]:
        """The requests logged since the last call."""
        entries = self.log()
        fresh, self._taken = entries[self._taken :], len(entries)
        return fresh

    def take_kinds(self) -> list[str]:
        return [classify(e) for e in self.take()]

    def mapper_env(self, work: Path, **extra: str) -> dict[str, str]:
        """A child environment whose mapper-state talks to the proxy."""
        section = "MAPPER_STATE_STATE_BACKEND__S3__"
        return clean_env(
            work,
            AWS_DEFAULT_REGION=REGION,
            **{
                f"{section}ENDPOINT_URL": self.endpoint,
                f"{section}AWS_ACCESS_KEY_ID": KEY_ID,
                f"{section}AWS_SECRET_ACCESS_KEY": SECRET,
                f"{section}REGION": REGION,
            },
            **extra,
        )

    def meltano_env(self, work: Path, uri: str, **extra: str) -> dict[str, str]:
        """A child environment whose Meltano keeps its state at ``uri`` through the proxy."""
        return clean_env(
            work,
            AWS_DEFAULT_REGION=REGION,
            MELTANO_STATE_BACKEND_URI=uri,
            MELTANO_STATE_BACKEND_S3_ENDPOINT_URL=self.endpoint,
            MELTANO_STATE_BACKEND_S3_AWS_ACCESS_KEY_ID=KEY_ID,
            MELTANO_STATE_BACKEND_S3_AWS_SECRET_ACCESS_KEY=SECRET,
            **extra,
        )

    def stored_state(self, bucket: str, key: str) -> Any:
        """The Singer state in a stored Meltano document, or a BenchError if there is none."""
        client = self.client()
        try:
            document = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        except client.exceptions.NoSuchKey:
            raise BenchError(f"no state was stored at s3://{bucket}/{key}") from None
        return document.get("completed", {}).get("singer_state")


def seed(wire: Wire, bucket: str, objects: Iterable[tuple[str, bytes]]) -> int:
    """Put many objects into ``bucket`` quickly; return how many.

    moto's server runs in this process, so its S3 backend is written directly (tens of
    thousands of objects a second, against a few hundred through HTTP); a moto whose
    internals moved falls back to boto3 ``put_object``.
    """
    items = list(objects)
    try:
        from moto.backends import get_backend
        from moto.core.models import DEFAULT_ACCOUNT_ID

        backend = get_backend("s3")[DEFAULT_ACCOUNT_ID]["global"]
        for key, body in items:
            backend.put_object(bucket, key, body)
    except (ImportError, AttributeError, KeyError, TypeError):
        from concurrent.futures import ThreadPoolExecutor

        client = wire.client()
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(lambda kv: client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), items)
            )
    return len(items)


def count_keys(wire: Wire, bucket: str, prefix: str) -> int:
    """How many keys moto holds under ``prefix`` (a check that seeding worked)."""
    pages = wire.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sum(len(page.get("Contents", [])) for page in pages)


@contextlib.contextmanager
def s3_behind_proxy() -> Iterator[Wire]:
    """moto's S3 on 127.0.0.1 behind a counting mitmproxy, for the length of the block."""
    from tests.proxy import FaultProxy, ProxyUnavailable
    from tests.support.moto import AtomicMotoServer  # writes atomic, as on S3

    try:
        server = AtomicMotoServer()
    except ImportError:
        raise BenchError("moto[server] is not installed: make setup") from None
    server.start()
    try:
        direct = server.endpoint
        try:
            with FaultProxy(direct) as proxy:
                yield Wire(direct, proxy)
        except ProxyUnavailable as exc:
            raise BenchError(str(exc)) from None
    finally:
        server.stop()
