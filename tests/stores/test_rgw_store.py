"""The S3 store against Ceph's RADOS Gateway, a second real S3 server beside moto.

RGW refuses a quoted ETag in ``If-Match`` and ignores ``If-Match`` on deletes
(tests/test_rgw_server.py pins both). The same contract suites run here unchanged,
and the CLI works end to end: ``doctor`` passes and says how it copes, a run renews
its lease, and an expired lease is taken over.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from mapper_state.core.lease import read_lease
from mapper_state.stores.base import Blob
from mapper_state.stores.s3.store import S3Store
from tests.contract.location_contract import OnEmulator
from tests.helpers import MAPPER, clean_env, run_cli, spawn_cli
from tests.servers import StoreLocation
from tests.support.sdk import s3_client

pytestmark = pytest.mark.cloud
STATE = b'{"type": "STATE", "value": {"bookmarks": {"t": {"id": %d}}}}\n'


class TestRgwStore(OnEmulator):
    @pytest.fixture
    def location(self, rgw_location: StoreLocation) -> StoreLocation:
        return rgw_location


def test_a_replace_refused_while_another_thread_learned_unquoted_etags_still_lands(
    rgw_location: StoreLocation,
) -> None:
    # The heartbeat and the run share one store object. A replace sent with the quoted
    # ETag is refused by RGW; if, while that refusal is on the wire, the other thread has
    # learned that RGW wants bare ETags, the refusal is still a quoting one, not a
    # conflict: the write must land. botocore's own event hook plays the other thread,
    # at the one moment the two threads' interleaving leaves open.
    client = s3_client(rgw_location.options)
    store = S3Store(
        client, rgw_location.bucket, rgw_location.prefix, endpoint=client.meta.endpoint_url
    )
    version = store.create("k/state.json", b"0")

    def the_other_thread_learns(http_response: Any, **_: Any) -> None:
        if http_response.status_code == 412:
            store.traits.learned.unquoted_etags.learn()

    client.meta.events.register("after-call.s3.PutObject", the_other_thread_learns)
    assert not store.traits.learned.unquoted_etags.known
    new = store.replace("k/state.json", b"1", if_version=version)
    assert store.read("k/state.json") == Blob(b"1", new)
    store.close()


def test_doctor_passes_and_says_how_it_copes(rgw_location: StoreLocation) -> None:
    result = run_cli("doctor", "--format", "json", env=clean_env(**rgw_location.env))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "safe"
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["create-if-absent"]["status"] == "ok"
    assert checks["compare-and-swap"]["status"] == "ok"
    assert "without the quotes" in checks["compare-and-swap"]["detail"]
    assert "condition is ignored" in checks["conditional delete"]["detail"]
    assert "compare-and-swap to a released lease record" in checks["release"]["detail"]


def test_a_long_run_renews_and_an_expired_lease_is_taken_over(
    rgw_location: StoreLocation,
) -> None:
    env = clean_env(**rgw_location.env)
    # TTL 4 s: a renewal has 1.9 s to answer (at 1.5 s it had 0.7 s, short for RGW under load)
    ttl = ["--lock-timeout-seconds", "4", "--checkpoint-interval-seconds", "0"]
    holder = spawn_cli("--state-id", "rgw", *ttl, env=env)
    assert holder.stdin is not None
    holder.stdin.write(STATE % 1)
    holder.stdin.flush()
    time.sleep(6)  # past the TTL and the skew allowance: renewals, each a compare-and-swap
    # with an unquoted ETag
    busy = run_cli("--state-id", "rgw", input=STATE % 9, env=env)
    assert busy.returncode == 3, busy.stderr
    out, err = holder.communicate(STATE % 2, timeout=60)
    assert holder.returncode == 0, err
    assert out == STATE % 1 + STATE % 2
    got = run_cli("state", "get", "rgw", env=env)
    assert json.loads(got.stdout) == {"bookmarks": {"t": {"id": 2}}}

    # a holder SIGKILLed mid-run: its lease expires and the next run takes it over
    crashed = spawn_cli("--state-id", "rgw", *ttl, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        record, _ = read_lease(rgw_location.open(), "rgw")
        if record is not None and record.held:
            break
        time.sleep(0.05)
    crashed.kill()
    crashed.wait()
    time.sleep(5.5)  # past the TTL and the skew allowance (4.8 s)
    taker = run_cli("--state-id", "rgw", *ttl, input=STATE % 3, env=env)
    assert taker.returncode == 0, taker.stderr
    assert json.loads(run_cli("state", "get", "rgw", env=env).stdout) == {
        "bookmarks": {"t": {"id": 3}}
    }
    set_ = run_cli("state", "set", "rgw", '{"bookmarks": {}}', env=env)
    assert set_.returncode == 0, set_.stderr
    status = subprocess.run(
        [MAPPER, "lock", "status", "rgw", "--format", "json"],
        capture_output=True,
        env=env,
        check=False,
    )
    assert json.loads(status.stdout)["status"] == "free"
