"""The S3 store against moto in server mode: the contracts, plus what only S3 promises."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mapper_state.errors import ConfigError
from mapper_state.stores import open_store
from mapper_state.stores.base import StoreAccessDenied
from mapper_state.stores.s3.store import from_uri
from tests.contract.location_contract import OnEmulator, PrefixContract
from tests.servers import Emulator, StoreLocation, free_port
from tests.stores import wire_checks
from tests.support.sdk import s3_client

pytestmark = pytest.mark.cloud


def bucket_keys(location: StoreLocation) -> list[str]:
    pages = (
        s3_client(location.emulator.options)
        .get_paginator("list_objects_v2")
        .paginate(Bucket=location.bucket)
    )
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def test_list_follows_pagination_past_1000_keys(s3_location: StoreLocation) -> None:
    client = s3_client(s3_location.options)
    keys = [f"id-{i:04d}/state.json" for i in range(1100)]

    def put(key: str) -> None:
        client.put_object(Bucket=s3_location.bucket, Key=key, Body=b"{}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, [f"{s3_location.prefix}/{key}" for key in keys]))
    put(f"{s3_location.prefix}ful/not-mine")  # shares the prefix string, not the folder
    store = s3_location.open()
    assert sorted(store.list()) == keys
    assert sorted(store.list("id-10")) == keys[1000:1100]


def test_server_side_encryption_is_sent_on_every_write(s3_location: StoreLocation) -> None:
    client = s3_client(s3_location.options)
    store = s3_location.open(server_side_encryption="AES256")
    version = store.create("id/state.json", b"1")
    head = client.head_object(Bucket=s3_location.bucket, Key=f"{s3_location.prefix}/id/state.json")
    assert head["ServerSideEncryption"] == "AES256"
    store.replace("id/state.json", b"2", if_version=version)
    head = client.head_object(Bucket=s3_location.bucket, Key=f"{s3_location.prefix}/id/state.json")
    assert head["ServerSideEncryption"] == "AES256"

    kms = s3_location.open(server_side_encryption="aws:kms", sse_kms_key_id="alias/state")
    kms.create("id/lease", b"1")
    head = client.head_object(Bucket=s3_location.bucket, Key=f"{s3_location.prefix}/id/lease")
    assert head["ServerSideEncryption"] == "aws:kms"
    assert head["SSEKMSKeyId"].endswith("alias/state")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"aws_access_key_id": "AKIAEXAMPLE"}, "state_backend.s3.aws_secret_access_key"),
        ({"aws_secret_access_key": "s3cr3t-value"}, "state_backend.s3.aws_access_key_id"),
        ({"aws_session_token": "t0ken-value"}, "state_backend.s3.aws_access_key_id"),
        ({"server_side_encryption": "rot13"}, "state_backend.s3.server_side_encryption"),
        (
            {"server_side_encryption": "AES256", "sse_kms_key_id": "k"},
            "state_backend.s3.sse_kms_key_id",
        ),
        ({"endpoint_url": "localhost:9000"}, "state_backend.s3.endpoint_url"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(options: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        open_store("s3://bucket/prefix", {"s3": options})
    assert named in caught.value.message
    assert "s3cr3t" not in caught.value.message
    assert "t0ken" not in caught.value.message


def test_uri_without_bucket_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"state_backend\.uri"):
        open_store("s3://", {"s3": {}})


def test_missing_bucket_is_a_clear_error(s3_location: StoreLocation) -> None:
    wire_checks.check_a_missing_bucket_is_a_clear_error(
        s3_location.open("s3://no-such-bucket/p"),
        "S3 bucket 'no-such-bucket' does not exist",
        asks=("read", "create", "list"),
    )


def test_wrong_credentials_are_one_line_without_the_secret(moto_auth_server: Emulator) -> None:
    options = dict(moto_auth_server.options)
    s3_client(moto_auth_server.options).create_bucket(Bucket="signed")
    good = open_store("s3://signed/p", {"s3": options})
    good.create("id/state.json", b"{}")  # the right key signs correctly

    wrong_secret = {**options, "aws_secret_access_key": "wrong-secret-value-123"}
    unknown_key = {**options, "aws_access_key_id": "AKIAUNKNOWNKEY000000"}
    for bad, code in ((wrong_secret, "SignatureDoesNotMatch"), (unknown_key, "InvalidAccessKeyId")):
        with pytest.raises(StoreAccessDenied) as caught:
            open_store("s3://signed/p", {"s3": bad}).read("id/state.json")
        message = caught.value.message
        assert code in message
        assert "s3://signed/p/id/state.json" in message
        assert "\n" not in message
        assert bad["aws_secret_access_key"] not in message


def test_no_credentials_anywhere_is_access_denied(
    s3_location: StoreLocation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    options = {"endpoint_url": s3_location.options["endpoint_url"], "region": "us-east-1"}
    with pytest.raises(StoreAccessDenied) as caught:
        open_store(s3_location.uri, {"s3": options}).read("id/state.json")
    assert "no usable AWS credentials" in caught.value.message
    assert "state_backend.s3.aws_access_key_id" in caught.value.message


def test_unreachable_endpoint_fails_in_bounded_time(s3_location: StoreLocation) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    options = {**s3_location.options, "endpoint_url": endpoint}
    store = from_uri(f"{s3_location.bucket}/p", options, retry_deadline_seconds=1)
    assert f"cannot reach S3 at {endpoint}" in wire_checks.unreachable_error(store)


def test_opening_other_stores_imports_no_aws_sdk() -> None:
    wire_checks.check_other_stores_import_no_sdk("boto3", "botocore")


# -- the contracts -----------------------------------------------------------------------


class TestS3Store(OnEmulator, PrefixContract, wire_checks.BadWireContract):
    list_bucket = staticmethod(bucket_keys)
    resets = 4

    @pytest.fixture
    def location(self, s3_location: StoreLocation) -> StoreLocation:
        return s3_location
