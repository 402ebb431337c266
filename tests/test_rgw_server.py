"""What Ceph's RADOS Gateway enforces of S3's conditional requests, measured through boto3.

These tests document the server, not mapper-state: they pin the facts a store on RGW
(and the ``rgw_server`` emulator's flags) rely on, so that a different Ceph release
that changes them fails here first. Measured on Ceph 16.2 (pacific, Debian 12):

- PutObject ``If-None-Match: *`` on an existing key: 412, the object is kept.
- PutObject ``If-Match`` with a wrong ETag: 412; on a missing key: 412 (AWS: 404).
- PutObject ``If-Match`` with the ETag as S3 returns it, in quotes: 412. RGW compares
  the header with the ETag without its quotes: only the unquoted value is accepted.
- DeleteObject ``If-Match`` with a wrong ETag: the object is deleted (204).
"""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.servers import StoreLocation
from tests.support.sdk import s3_client

pytestmark = pytest.mark.cloud

KEY = "pipelines/state/id/lease"
WRONG_ETAG = '"0123456789abcdef0123456789abcdef"'


def client(location: StoreLocation) -> Any:  # a boto3 S3 client
    return s3_client(location.options)


def status(error: pytest.ExceptionInfo[ClientError]) -> int:
    return int(error.value.response["ResponseMetadata"]["HTTPStatusCode"])


def body(location: StoreLocation) -> bytes:
    return bytes(client(location).get_object(Bucket=location.bucket, Key=KEY)["Body"].read())


def put(location: StoreLocation, data: bytes, **condition: str) -> str:
    response = client(location).put_object(Bucket=location.bucket, Key=KEY, Body=data, **condition)
    return str(response["ETag"])


def test_create_if_none_match_refuses_an_existing_key(rgw_location: StoreLocation) -> None:
    put(rgw_location, b"first", IfNoneMatch="*")  # absent: created
    with pytest.raises(ClientError) as refused:
        put(rgw_location, b"second", IfNoneMatch="*")
    assert status(refused) == 412
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert body(rgw_location) == b"first"


def test_replace_if_match_refuses_a_wrong_etag(rgw_location: StoreLocation) -> None:
    put(rgw_location, b"first")
    for wrong in (WRONG_ETAG, WRONG_ETAG.strip('"')):
        with pytest.raises(ClientError) as refused:
            put(rgw_location, b"second", IfMatch=wrong)
        assert status(refused) == 412
    assert body(rgw_location) == b"first"


def test_replace_if_match_refuses_a_missing_key(rgw_location: StoreLocation) -> None:
    with pytest.raises(ClientError) as refused:
        put(rgw_location, b"second", IfMatch=WRONG_ETAG.strip('"'))
    assert status(refused) == 412  # AWS S3 answers 404 NoSuchKey


def test_replace_if_match_accepts_only_the_unquoted_etag(rgw_location: StoreLocation) -> None:
    etag = put(rgw_location, b"first")
    assert etag.startswith('"')
    assert etag.endswith('"')  # as S3 returns it
    with pytest.raises(ClientError) as refused:
        put(rgw_location, b"second", IfMatch=etag)  # AWS S3 and moto accept this
    assert status(refused) == 412
    assert body(rgw_location) == b"first"

    put(rgw_location, b"third", IfMatch=etag.strip('"'))
    assert body(rgw_location) == b"third"


def test_delete_ignores_if_match(rgw_location: StoreLocation) -> None:
    put(rgw_location, b"first")
    s3 = client(rgw_location)
    response = s3.delete_object(Bucket=rgw_location.bucket, Key=KEY, IfMatch=WRONG_ETAG)
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 204
    with pytest.raises(ClientError) as gone:
        s3.head_object(Bucket=rgw_location.bucket, Key=KEY)
    assert status(gone) == 404
    assert rgw_location.emulator.ignores_delete_preconditions
