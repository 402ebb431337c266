"""moto, as the suite runs it, decides racing conditional writes as S3 does: one wins.

S3 makes a conditional write atomic: of creates racing with ``If-None-Match: *`` on one
key, exactly one succeeds. moto's own server checks and then writes in separate steps
on a thread per request, so two racing creates can both succeed (found by the full chaos
budget: two holders of one lease for 0.1 s in 1,600 holds). ``tests/support/moto.py``
runs one write at a time; these tests race real clients against it, on creates of one
key and on replaces of one version.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from mapper_state.testing import race
from tests.servers import Emulator
from tests.support.sdk import new_bucket, s3_client

pytestmark = pytest.mark.cloud

RACERS = 8
ROUNDS = 40


@pytest.fixture(autouse=True)
def threads_switch_often() -> Iterator[None]:
    """moto serves from threads of this process: switching between them every 10 us
    instead of every 5 ms makes a check-then-write race likely in each round."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def put_race(client: Any, bucket: str, key: str, write: dict[str, str]) -> list[int]:
    """``RACERS`` threads put ``key`` at once with the condition ``write``; the winners.

    A refusal other than 412 (``PreconditionFailed``) fails the race, as a crash would."""

    def put(n: int) -> bool:
        try:
            client.put_object(Bucket=bucket, Key=key, Body=str(n).encode(), **write)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "PreconditionFailed":
                raise
            return False
        return True

    return race([functools.partial(put, n) for n in range(RACERS)])


def test_racing_creates_of_one_key_have_one_winner(moto_server: Emulator) -> None:
    client = s3_client(moto_server.options, max_pool_connections=RACERS)
    bucket = new_bucket(moto_server.options)
    for r in range(ROUNDS):
        key = f"race-{r}"
        won = put_race(client, bucket, key, {"IfNoneMatch": "*"})
        assert len(won) == 1, f"round {r}: {len(won)} creates succeeded"
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert body == str(won[0]).encode()


def test_racing_replaces_of_one_version_have_one_winner(moto_server: Emulator) -> None:
    client = s3_client(moto_server.options, max_pool_connections=RACERS)
    bucket = new_bucket(moto_server.options)
    for r in range(ROUNDS):
        key = f"race-{r}"
        etag = client.put_object(Bucket=bucket, Key=key, Body=b"first")["ETag"]
        won = put_race(client, bucket, key, {"IfMatch": etag})
        assert len(won) == 1, f"round {r}: {len(won)} replaces of one version succeeded"
