"""A store that ignores create-if-absent never lets runs share a lease without a word.

s3rver answers 200 to ``If-None-Match: *`` on an existing key: every racer's create
"wins". The acquire proves the condition on every run (a second create of the lease
object, which must be refused), so on s3rver every racer refuses with exit 11 naming
``doctor``, and none runs. moto and Ceph RGW, which enforce the condition, are the
controls: every racer runs, one at a time. A user who has checked the store skips the
proof with ``state_backend.s3.conditional_writes_checked``.
"""

from __future__ import annotations

import json
import uuid

import pytest

from mapper_state.errors import ExitCode
from tests.chaos import cli
from tests.servers import StoreLocation
from tests.support.cli import one_line_error

pytestmark = pytest.mark.cloud

RACERS = 8


def race(location: StoreLocation, state_id: str) -> list[tuple[int, str]]:
    """``RACERS`` filter runs started at once on one state ID: their exit codes and stderr."""
    args = ["--state-id", state_id, "--lock-timeout-seconds", "15", "--lock-wait-seconds", "90"]
    args += ["--lock-retry-seconds", "0.2", "--checkpoint-interval-seconds", "0"]
    procs = [cli.spawn(location, *args) for _ in range(RACERS)]
    for i, proc in enumerate(procs):  # every stream ends at once: a holder goes when done
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"type": "STATE", "value": {"racer": i}}).encode() + b"\n")
        proc.stdin.close()
    results = []
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stderr is not None
        err = proc.stderr.read()  # the stream's echo on stdout is one line: no pipe fills up
        proc.stdout.read()
        results.append((proc.wait(timeout=150), err.decode(errors="replace")))
    return results


@pytest.mark.parametrize("fixture", ["s3_location", "rgw_location"])
def test_on_stores_that_enforce_the_condition_every_racer_runs(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    location: StoreLocation = request.getfixturevalue(fixture)
    state_id = f"chaos-racers-{uuid.uuid4().hex[:8]}"
    results = race(location, state_id)
    assert [code for code, _ in results] == [0] * RACERS, results
    assert cli.stored(location.open(), state_id) in [{"racer": i} for i in range(RACERS)]


def test_on_s3rver_every_racer_refuses_and_names_doctor(s3rver_location: StoreLocation) -> None:
    state_id = f"chaos-racers-{uuid.uuid4().hex[:8]}"
    results = race(s3rver_location, state_id)
    codes = [code for code, _ in results]
    assert ExitCode.OK not in codes, results
    for code, err in results:
        line = one_line_error(err.encode())
        if code == ExitCode.STORE:  # s3rver itself failed a racing write (its files clash)
            continue
        assert code == ExitCode.UNSAFE_STORE, results
        assert "ignores create-if-absent" in line, line
        assert "mapper-state doctor" in line, line
    assert codes.count(ExitCode.UNSAFE_STORE) >= RACERS // 2, results
    assert cli.stored(s3rver_location.open(), state_id) is None, "a racer stored its state"


def test_the_proof_is_skipped_where_the_user_says_the_store_was_checked(
    s3rver_location: StoreLocation,
) -> None:
    """The setting is the user's word: on s3rver (unsafe, as doctor would say) a run then goes."""
    state_id = f"chaos-checked-{uuid.uuid4().hex[:8]}"
    env = cli.env_for(
        s3rver_location, MAPPER_STATE_STATE_BACKEND__S3__CONDITIONAL_WRITES_CHECKED="true"
    )
    line = json.dumps({"type": "STATE", "value": {"checked": True}}).encode() + b"\n"
    proc = cli.run(s3rver_location, "--state-id", state_id, input=line, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert cli.stored(s3rver_location.open(), state_id) == {"checked": True}
