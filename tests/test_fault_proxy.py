"""The fault proxy does what it says, against real emulators and SDKs.

Why it exists: the stores' fault tests and the request-count benchmarks rely on
``tests.proxy.FaultProxy``; these tests check each fault on the wire as the SDK
sees it (boto3 against moto; the Azure and GCS SDKs against their emulators) and
that "count only" passes every request through untouched and counts it exactly.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from tests.proxy import FaultProxy, ProxyUnavailable
from tests.proxy.pool import ProxyPool
from tests.servers import Emulator, StoreLocation
from tests.support import sdk

pytestmark = pytest.mark.cloud

BUCKET_PREFIX = "fault-proxy"
DELAY = 0.5


def s3_client(emulator: Emulator, endpoint_url: str | None = None, **config: Any) -> Any:
    """A boto3 S3 client on ``endpoint_url`` (default: the emulator itself), no retries."""
    settings: dict[str, Any] = {
        "retries": {"total_max_attempts": 1, "mode": "standard"},
        "connect_timeout": 2,
        "read_timeout": 5,
        **config,
    }
    return sdk.s3_client(emulator.options, endpoint_url=endpoint_url, **settings)


@contextlib.contextmanager
def start_proxy(pool: ProxyPool, target_url: str, **kwargs: Any) -> Iterator[FaultProxy]:
    """A running proxy, as if just started (reused from ``pool``); a missing mitmdump fails
    the test with the command that installs it."""
    try:
        proxy = pool.acquire(target_url, **kwargs)
    except ProxyUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield proxy
    finally:
        pool.release(proxy)


@pytest.fixture
def proxy(proxy_pool: ProxyPool, moto_server: Emulator) -> Iterator[FaultProxy]:
    """A proxy in front of moto, counting only until a test sets faults."""
    with start_proxy(proxy_pool, moto_server.endpoint) as p:
        yield p


@pytest.fixture
def bucket(moto_server: Emulator) -> str:
    """A fresh bucket, made directly on moto (the proxy's log starts empty)."""
    name = f"{BUCKET_PREFIX}-{os.urandom(6).hex()}"
    s3_client(moto_server).create_bucket(Bucket=name)
    return name


@pytest.fixture
def direct(moto_server: Emulator) -> Any:
    """A client on moto itself, to see what the server holds."""
    return s3_client(moto_server)


@pytest.fixture
def client(moto_server: Emulator, proxy: FaultProxy) -> Any:
    """A client through the proxy, with retries off."""
    return s3_client(moto_server, proxy.url)


def exists(direct: Any, bucket: str, key: str) -> bool:
    try:
        direct.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if e.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return False
        raise
    return True


def status_of(error: ClientError) -> int:
    return int(error.response["ResponseMetadata"]["HTTPStatusCode"])


# -- count only ----------------------------------------------------------------


def test_count_only_passes_everything_through_and_counts_exactly(
    proxy: FaultProxy, client: Any, bucket: str
) -> None:
    body = os.urandom(1_500_000)  # binary; a file object: boto3 sends Expect: 100-continue
    client.put_object(Bucket=bucket, Key="dir/obj", Body=io.BytesIO(body), Metadata={"m": "v"})
    got = client.get_object(Bucket=bucket, Key="dir/obj")
    assert got["Body"].read() == body
    assert got["Metadata"] == {"m": "v"}
    etag = client.head_object(Bucket=bucket, Key="dir/obj")["ETag"]
    with pytest.raises(ClientError) as refused:  # the server's own errors pass through too
        client.put_object(Bucket=bucket, Key="dir/obj", Body=b"other", IfNoneMatch="*")
    assert status_of(refused.value) == 412
    client.put_object(Bucket=bucket, Key="dir/obj", Body=b"new", IfMatch=etag)
    listed = client.list_objects_v2(Bucket=bucket, Prefix="dir/")
    assert [o["Key"] for o in listed["Contents"]] == ["dir/obj"]
    client.delete_object(Bucket=bucket, Key="dir/obj")

    seen = [(r["method"], r["path"], r["status"], r["fault"]) for r in proxy.requests()]
    key = f"/{bucket}/dir/obj"
    assert seen == [
        ("PUT", key, 200, None),
        ("GET", key, 200, None),
        ("HEAD", key, 200, None),
        ("PUT", key, 412, None),
        ("PUT", key, 200, None),
        ("GET", f"/{bucket}", 200, None),  # the query (list-type=2&prefix=...) is not logged
        ("DELETE", key, 204, None),
    ]
    records = proxy.requests()
    assert all(r["upstream_status"] == r["status"] for r in records)
    assert records[0]["request_bytes"] == len(body)
    assert records[1]["response_bytes"] == len(body)
    assert "prefix=dir%2F" in records[5]["query"]
    assert proxy.count() == 7
    assert proxy.count("PUT") == 3
    assert proxy.count("get", path_contains="/dir/obj") == 1
    assert proxy.count(path_contains="/dir/") == 6
    proxy.clear()
    assert proxy.count() == 0
    client.head_bucket(Bucket=bucket)
    assert proxy.count("HEAD") == 1


def test_signed_requests_reach_a_signature_checking_server(
    proxy_pool: ProxyPool, moto_auth_server: Emulator
) -> None:
    """SigV4 signs the Host header: the proxy must not rewrite it (keep_host_header)."""
    with start_proxy(proxy_pool, moto_auth_server.endpoint) as p:
        client = s3_client(moto_auth_server, p.url)
        name = f"{BUCKET_PREFIX}-{os.urandom(6).hex()}"
        client.create_bucket(Bucket=name)
        client.put_object(Bucket=name, Key="k", Body=b"signed")
        assert client.get_object(Bucket=name, Key="k")["Body"].read() == b"signed"
        assert [r["status"] for r in p.requests()] == [200, 200, 200]


# -- answers instead of the server's -------------------------------------------------


@pytest.mark.parametrize("status", [500, 503])
def test_error_is_answered_without_reaching_the_server(
    proxy: FaultProxy, client: Any, direct: Any, bucket: str, status: int
) -> None:
    proxy.set_faults(error=1.0, error_statuses=[status])
    with pytest.raises(ClientError) as caught:
        client.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert status_of(caught.value) == status
    assert not exists(direct, bucket, "k")
    [record] = proxy.requests()
    assert record["fault"] == "error"
    assert record["status"] == status
    assert record["upstream_status"] is None


def test_head_error_has_no_body(proxy: FaultProxy, client: Any, bucket: str) -> None:
    proxy.set_faults(error=1.0, error_statuses=[503], max_faults=1)
    with pytest.raises(ClientError) as caught:
        client.head_object(Bucket=bucket, Key="k")
    assert status_of(caught.value) == 503
    client.head_bucket(Bucket=bucket)  # the same keep-alive connection still works
    assert [r["status"] for r in proxy.requests()] == [503, 200]


def test_throttle_is_an_s3_slowdown_that_boto3_retries(
    moto_server: Emulator, proxy: FaultProxy, bucket: str
) -> None:
    client = s3_client(
        moto_server, proxy.url, retries={"total_max_attempts": 3, "mode": "standard"}
    )
    proxy.set_faults(throttle=1.0)
    with pytest.raises(ClientError) as caught:
        client.get_object(Bucket=bucket, Key="k")
    assert caught.value.response["Error"]["Code"] == "SlowDown"
    assert status_of(caught.value) == 503
    assert proxy.count("GET", fault="throttle") == 3


def test_error_applied_reaches_the_server_but_answers_an_error(
    proxy: FaultProxy, client: Any, direct: Any, bucket: str
) -> None:
    proxy.set_faults(error_applied=1.0, error_statuses=[500])
    with pytest.raises(ClientError) as caught:
        client.put_object(Bucket=bucket, Key="k", Body=b"applied")
    assert status_of(caught.value) == 500
    assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"applied"
    [record] = proxy.requests()
    assert (record["status"], record["upstream_status"]) == (500, 200)


# -- connections closed, answers lost ------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "upstream_status"),
    [("reset", None), ("drop_response", 200)],
    ids=["reset closes without forwarding", "drop_response applies then closes"],
)
def test_reset_and_drop_response_close_the_connection(
    proxy: FaultProxy,
    client: Any,
    direct: Any,
    bucket: str,
    fault: str,
    upstream_status: int | None,
) -> None:
    proxy.set_faults(**{fault: 1.0})
    with pytest.raises(ConnectionClosedError):
        client.put_object(Bucket=bucket, Key="k", Body=b"applied")
    applied = upstream_status is not None
    assert exists(direct, bucket, "k") is applied
    if applied:
        assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"applied"
    [record] = proxy.requests()
    assert (record["fault"], record["status"], record["upstream_status"]) == (
        fault,
        None,
        upstream_status,
    )


def test_a_lost_create_response_comes_back_as_412_from_boto3s_retry(
    moto_server: Emulator, proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    """What a store must expect: boto3 retries the applied create, which then conflicts."""
    client = s3_client(
        moto_server, proxy.url, retries={"total_max_attempts": 3, "mode": "standard"}
    )
    proxy.set_faults(drop_response=1.0, max_faults=1)
    with pytest.raises(ClientError) as caught:
        client.put_object(Bucket=bucket, Key="lease", Body=b"mine", IfNoneMatch="*")
    assert status_of(caught.value) == 412
    assert direct.get_object(Bucket=bucket, Key="lease")["Body"].read() == b"mine"
    assert [(r["fault"], r["status"]) for r in proxy.requests()] == [
        ("drop_response", None),
        (None, 412),
    ]


def test_blackhole_never_answers(
    moto_server: Emulator, proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    client = s3_client(moto_server, proxy.url, read_timeout=1)
    proxy.set_faults(blackhole=1.0)
    with pytest.raises(ReadTimeoutError):
        client.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert not exists(direct, bucket, "k")
    assert proxy.count("PUT", fault="blackhole") == 1
    proxy.set_faults()
    client.put_object(Bucket=bucket, Key="k", Body=b"x")  # a new connection gets through


# -- delays --------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["delay", "delay_request"])
def test_delay_holds_the_request_or_its_response(
    proxy: FaultProxy, client: Any, direct: Any, bucket: str, fault: str
) -> None:
    proxy.set_faults(**{fault: 1.0, "delay_seconds": DELAY})
    started = time.monotonic()
    client.put_object(Bucket=bucket, Key="k", Body=b"late")
    assert time.monotonic() - started >= DELAY
    assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"late"
    [record] = proxy.requests()
    assert (record["fault"], record["status"]) == (fault, 200)
    assert record["elapsed"] >= DELAY


# -- control ---------------------------------------------------------------------


def test_faults_change_while_the_proxy_runs(proxy: FaultProxy, client: Any, bucket: str) -> None:
    client.put_object(Bucket=bucket, Key="k", Body=b"1")
    proxy.set_faults(error=1.0, error_statuses=[503])
    with pytest.raises(ClientError):
        client.get_object(Bucket=bucket, Key="k")
    proxy.set_faults(reset=1.0)
    with pytest.raises(ConnectionClosedError):
        client.get_object(Bucket=bucket, Key="k")
    proxy.set_faults()
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"1"
    assert [r["fault"] for r in proxy.requests()] == [None, "error", "reset", None]


@pytest.mark.parametrize(
    ("chooser", "spared", "faulted"),
    [
        ({"match": "/lease"}, ("p/state.json", b"{}"), ("p/lease", b"{}")),
        ({"body_match": "needle"}, ("a", b"hay"), ("b", b"hay with a needle")),
    ],
    ids=["match", "body_match"],
)
def test_match_and_body_match_choose_the_requests_to_fault(
    proxy: FaultProxy,
    client: Any,
    bucket: str,
    chooser: dict[str, str],
    spared: tuple[str, bytes],
    faulted: tuple[str, bytes],
) -> None:
    proxy.set_faults(error=1.0, **chooser)
    client.put_object(Bucket=bucket, Key=spared[0], Body=spared[1])
    with pytest.raises(ClientError):
        client.put_object(Bucket=bucket, Key=faulted[0], Body=faulted[1])
    assert [r["fault"] for r in proxy.requests()] == [None, "error"]


def test_methods_narrow_a_match(proxy: FaultProxy, client: Any, bucket: str) -> None:
    client.put_object(Bucket=bucket, Key="p/state.json", Body=b"{}")
    proxy.set_faults(error=1.0, match="/lease", methods=["GET"])
    client.put_object(Bucket=bucket, Key="p/lease", Body=b"{}")
    client.get_object(Bucket=bucket, Key="p/state.json")
    with pytest.raises(ClientError):
        client.get_object(Bucket=bucket, Key="p/lease")
    assert [r["fault"] for r in proxy.requests()] == [None, None, None, "error"]
    assert proxy.count(fault="error") == 1
    assert proxy.count(path_contains="/lease", fault="error") == 1


def test_max_faults_faults_only_the_first_requests(
    proxy: FaultProxy, client: Any, bucket: str
) -> None:
    proxy.set_faults(error=1.0, max_faults=2)
    for _ in range(2):
        with pytest.raises(ClientError):
            client.head_bucket(Bucket=bucket)
    client.head_bucket(Bucket=bucket)
    client.head_bucket(Bucket=bucket)
    assert [r["fault"] for r in proxy.requests()] == ["error", "error", None, None]


def test_a_seed_gives_the_same_faults_in_the_same_order(
    proxy_pool: ProxyPool, moto_server: Emulator, bucket: str
) -> None:
    def outcomes(seed: int) -> list[str | None]:
        with start_proxy(proxy_pool, moto_server.endpoint, seed=seed, faults={"error": 0.5}) as p:
            client = s3_client(moto_server, p.url)
            for _ in range(16):
                with contextlib.suppress(ClientError):
                    client.head_bucket(Bucket=bucket)
            return [r["fault"] for r in p.requests()]

    first = outcomes(7)
    assert len(first) == 16
    assert set(first) == {None, "error"}
    assert outcomes(7) == first


def test_bad_faults_are_refused_by_the_helper(proxy: FaultProxy) -> None:
    refused: list[tuple[dict[str, Any], str]] = [
        ({"error": 1.5}, "a rate is a number in"),
        ({"error": 0.6, "reset": 0.6}, "add up to more than 1"),
        ({"errors": 1.0}, "unknown key"),
        ({"methods": "GET"}, "a list of HTTP methods"),
    ]
    for bad, why in refused:
        with pytest.raises(ValueError, match=why):
            proxy.set_faults(**bad)
    with pytest.raises(ValueError, match="a number of seconds >= 0"):
        FaultProxy("http://127.0.0.1:1", faults={"delay_seconds": -1})


def test_an_unreadable_control_file_keeps_the_faults_and_says_why(
    proxy: FaultProxy, client: Any, bucket: str
) -> None:
    proxy.set_faults(error=1.0, error_statuses=[503])
    with pytest.raises(ClientError):
        client.head_bucket(Bucket=bucket)  # the proxy has read the faults
    for text in ("{not json", '{"error": 2}'):
        proxy.faults_file.write_text(text, encoding="utf-8")  # not through the helper's check
        with pytest.raises(ClientError):
            client.head_bucket(Bucket=bucket)
    output = proxy.output_log.read_text(errors="replace")
    assert "cannot read" in output
    assert "a rate is a number in [0, 1]" in output


def test_a_missing_mitmdump_names_the_install_script(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("MITMDUMP", str(tmp_path / "no-such-mitmdump"))
    with pytest.raises(ProxyUnavailable, match=r"scripts/install-tools\.sh"):
        FaultProxy("http://127.0.0.1:1").start()


# -- the other SDKs ------------------------------------------------------------------


def test_azure_sdk_through_the_proxy(proxy_pool: ProxyPool, azure_location: StoreLocation) -> None:
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import BlobServiceClient

    endpoint = azure_location.emulator.endpoint  # http://127.0.0.1:PORT/devstoreaccount1
    with start_proxy(proxy_pool, endpoint) as p:
        connection_string = azure_location.options["connection_string"].replace(endpoint, p.url)
        service = BlobServiceClient.from_connection_string(connection_string, retry_total=0)
        blob = service.get_blob_client(azure_location.bucket, "k")
        blob.upload_blob(b"through", overwrite=True)
        assert blob.download_blob().readall() == b"through"
        assert p.count("PUT", path_contains=f"/{azure_location.bucket}/k") == 1
        assert all(r["status"] in (200, 201, 206) for r in p.requests())
        p.set_faults(error=1.0, error_statuses=[503])
        with pytest.raises(HttpResponseError) as caught:
            blob.get_blob_properties()
        assert caught.value.status_code == 503


def test_gcs_sdk_through_the_proxy(proxy_pool: ProxyPool, gcs_location: StoreLocation) -> None:
    from google.api_core.exceptions import ServiceUnavailable

    with start_proxy(proxy_pool, gcs_location.emulator.endpoint) as p:
        client = sdk.gcs_client(p.url)
        blob = client.bucket(gcs_location.bucket).blob("k")
        blob.upload_from_string(b"through", if_generation_match=0, retry=None)
        assert blob.download_as_bytes(retry=None) == b"through"
        assert p.count("POST", path_contains="/upload/") == 1
        assert p.count("GET", path_contains="/download/") == 1
        assert all(r["status"] == 200 for r in p.requests())
        p.set_faults(error=1.0, error_statuses=[503])
        with pytest.raises(ServiceUnavailable):
            blob.reload(retry=None)


def test_late_closes_the_client_and_delivers_the_request_afterwards(
    proxy: FaultProxy, client: Any, direct: Any, bucket: str
) -> None:
    proxy.set_faults(late=1.0, delay_seconds=DELAY)
    with pytest.raises(ConnectionClosedError):
        client.put_object(Bucket=bucket, Key="k", Body=b"late")
    assert not exists(direct, bucket, "k")  # not yet
    deadline = time.monotonic() + 10
    while not exists(direct, bucket, "k") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"late"
    records = proxy.requests()
    assert [(r["fault"], r["status"]) for r in records] == [("late", None), ("late_arrival", 200)]
    assert records[1]["time"] - records[0]["time"] >= DELAY


# -- reuse (tests/proxy/pool.py) -------------------------------------------------------


@pytest.fixture
def own_pool() -> Iterator[ProxyPool]:
    """A pool of this test's own, so what it hands out depends on this test alone."""
    pool = ProxyPool()
    yield pool
    pool.close()


def test_a_reused_proxy_is_as_good_as_a_fresh_one(
    own_pool: ProxyPool, moto_server: Emulator, direct: Any, bucket: str
) -> None:
    """No fault, count, held request or late copy of an earlier user is left, and the seed
    gives the faults of a proxy just started with it."""

    def outcomes(p: FaultProxy) -> list[tuple[int, str | None]]:
        client = s3_client(moto_server, p.url)
        for _ in range(16):
            with contextlib.suppress(ClientError):
                client.head_bucket(Bucket=bucket)
        return [(r["seq"], r["fault"]) for r in p.requests()]

    with start_proxy(own_pool, moto_server.endpoint, seed=7, faults={"error": 0.5}) as fresh:
        expected = outcomes(fresh)
    assert own_pool.started == 1
    assert [seq for seq, _ in expected] == list(range(1, 17))
    assert {fault for _, fault in expected} == {None, "error"}

    with start_proxy(own_pool, moto_server.endpoint) as used:
        assert used is fresh
        slow = s3_client(moto_server, used.url, read_timeout=1)
        used.set_faults(blackhole=1.0, match="/held")
        with pytest.raises(ReadTimeoutError):
            slow.put_object(Bucket=bucket, Key="held", Body=b"x")  # still held when it ends
        used.set_faults(late=1.0, delay_seconds=1.0, match="/late")
        with pytest.raises(ConnectionClosedError):
            slow.put_object(Bucket=bucket, Key="late", Body=b"x")  # its copy still pending
        used.faults_file.write_text("{not json", encoding="utf-8")
        slow.head_bucket(Bucket=bucket)  # the proxy complains in its output
        assert "cannot read" in used.output_log.read_text(errors="replace")

    with start_proxy(own_pool, moto_server.endpoint, seed=7, faults={"error": 0.5}) as again:
        assert again is used
        assert again.requests() == []
        assert again.output_log.read_text(errors="replace") == ""
        assert outcomes(again) == expected
        time.sleep(1.5)  # past the late copy's delay: a copy of the last user would be here
        assert not exists(direct, bucket, "late")
        assert not exists(direct, bucket, "held")
    assert own_pool.started == 1  # one process all along


def test_a_proxy_in_use_or_with_a_request_in_flight_is_not_handed_out(
    own_pool: ProxyPool, moto_server: Emulator, bucket: str
) -> None:
    first = own_pool.acquire(moto_server.endpoint)
    second = own_pool.acquire(moto_server.endpoint)
    assert first.port != second.port  # two users at once: two processes
    client = s3_client(moto_server, first.url, read_timeout=1)
    first.set_faults(blackhole=1.0)
    with pytest.raises(ReadTimeoutError):
        client.head_bucket(Bucket=bucket)
    assert not first.reconfigure(seed=3)  # the black-holed request is still in flight
    assert first.count(fault="blackhole") == 1  # and the refused reset changed nothing
    own_pool.release(first)  # its user is done: the held request is closed
    own_pool.release(second)
    assert own_pool.acquire(moto_server.endpoint) is first
    assert own_pool.acquire(moto_server.endpoint) is second
    assert own_pool.started == 2
    own_pool.release(first)
    own_pool.release(second)
