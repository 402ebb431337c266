"""The image, built and run: what only a running container shows.

``make image``'s image (``scripts/container.sh``: docker where it works, else podman with
the project's settings) is built once per session; each test runs it as a user would, with
a store on a volume or on the host's moto over the loopback (``--network host``), the tiny
tap and target of ``tests/fixtures`` mounted read-only: a whole incremental job twice, two
containers of one pipeline at once, ``podman stop`` in the middle of a job, the orphans of
a tap reaped by PID 1, the user, the JSON logs, the secrets. ``mapper-state exec`` too.
Where no container engine works the module is skipped with one line saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dist import built_once
from tests.helpers import MAPPER, clean_env, stored_state, wait_until
from tests.servers import StoreLocation
from tests.support.sdk import s3_client

# the first test builds the image (a few minutes on a cold cache, a machine of two cores)
pytestmark = [pytest.mark.container, pytest.mark.e2e, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parent.parent
CONTAINER = str(ROOT / "scripts" / "container.sh")
IMAGE = "mapper-state:dev"
FIXTURES = ROOT / "tests" / "fixtures"
TAP = "python /fixtures/tiny_tap.py"
TARGET = "python /fixtures/tiny_target.py /data/out.jsonl"
#: a container's start, a job and its end, on a loaded machine (not an assertion: a bound)
SLOW = 180


def engine(*args: str, timeout: float = SLOW) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([CONTAINER, *args], capture_output=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``make image`` once for the run: the first worker builds it, the others wait for it
    (and do not rebuild the wheel only to find the image up to date)."""
    found = engine("engine", timeout=60)
    if found.returncode != 0:
        pytest.skip(found.stderr.decode().strip().splitlines()[-1])
    os.environ["CONTAINER_ENGINE"] = found.stdout.decode().strip()

    def make_image(_: Path) -> None:
        built = subprocess.run(
            ["make", "-s", "image"], cwd=ROOT, capture_output=True, timeout=1200, check=False
        )
        assert built.returncode == 0, built.stderr.decode(errors="replace")[-3000:]

    built_once(tmp_path_factory, "mapper-state-image", make_image)
    return IMAGE


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """The volume mounted at /data, writable by the image's user."""
    path = tmp_path / "data"
    path.mkdir()
    path.chmod(0o777)
    return path


def run_args(
    data: Path, env: dict[str, str], *, name: str = "", network: str = "none"
) -> list[str]:
    """``run`` options: the volume, the fixtures, the environment (names only on the command
    line, values in the environment, as a secret would be passed)."""
    args = [CONTAINER, "run", "--rm", f"--network={network}"]
    args += ["--volume", f"{data}:/data", "--volume", f"{FIXTURES}:/fixtures:ro"]
    if name:
        args += ["--name", name]
    for key in env:
        args += ["--env", key]
    return args


def container_env(env: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **env}


def run(
    data: Path, env: dict[str, str], *command: str, network: str = "none"
) -> subprocess.CompletedProcess[bytes]:
    args = [*run_args(data, env, network=network), IMAGE, *command]
    return subprocess.run(
        args, env=container_env(env), capture_output=True, timeout=SLOW, check=False
    )


def job_env(uri: str, state_id: str = "prod:tiny", **extra: str) -> dict[str, str]:
    return {
        "MAPPER_STATE_STATE_ID": state_id,
        "MAPPER_STATE_STATE_BACKEND__URI": uri,
        "MAPPER_STATE_TAP": TAP,
        "MAPPER_STATE_TARGET": TARGET,
        "TINY_TAP_REPORT": "/data/tap-report.json",
        **extra,
    }


def json_log(stderr: bytes) -> list[dict[str, Any]]:
    """Every line of stderr, each one JSON object (the image's log format)."""
    entries = [json.loads(line) for line in stderr.decode().splitlines()]
    assert all(isinstance(entry, dict) for entry in entries), stderr
    return entries


def tap_got(data: Path) -> Any:
    return json.loads((data / "tap-report.json").read_text())["state"]


def test_run_from_the_environment_twice_on_a_volume(image: str, data: Path) -> None:
    env = job_env("file:///data/store")
    first = run(data, env)
    assert first.returncode == 0, first.stderr
    assert tap_got(data) == {}
    second = run(data, env)
    assert second.returncode == 0, second.stderr
    assert tap_got(data) == {"bookmarks": {"s": 3}}  # the second run got the state
    assert stored_state(data / "store", "prod:tiny") == {"bookmarks": {"s": 6}}
    assert (data / "out.jsonl").read_text().splitlines() == [
        json.dumps({"i": i}) for i in range(1, 7)
    ]
    for result in (first, second):
        assert any(e["message"] == "run finished" for e in json_log(result.stderr))
    # written by the image's user, uid 10001, not root
    assert (data / "store" / "prod:tiny" / "state.json").stat().st_uid == 10001


def bucket_bytes(location: StoreLocation) -> bytes:
    """Every object of the location's bucket, concatenated."""
    client = s3_client(location.options)
    listed = client.list_objects_v2(Bucket=location.bucket).get("Contents", [])
    return b"".join(
        client.get_object(Bucket=location.bucket, Key=o["Key"])["Body"].read() for o in listed
    )


def test_run_on_moto_over_the_loopback_twice(
    image: str, data: Path, s3_location: StoreLocation
) -> None:
    env = {**job_env(s3_location.uri), **s3_location.env}
    secret = s3_location.options["aws_secret_access_key"]
    for expected_start in ({}, {"bookmarks": {"s": 3}}):
        result = run(data, env, network="host")
        assert result.returncode == 0, result.stderr
        assert tap_got(data) == expected_start
        json_log(result.stderr)
        assert secret.encode() not in result.stderr
    assert secret.encode() not in bucket_bytes(s3_location)


@contextlib.contextmanager
def started(
    data: Path, env: dict[str, str], *command: str, name: str, network: str = "none"
) -> Iterator[subprocess.Popen[bytes]]:
    args = [*run_args(data, env, name=name, network=network), IMAGE, *command]
    proc = subprocess.Popen(
        args, env=container_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            engine("rm", "--force", "--time", "0", name)
            proc.communicate(timeout=SLOW)


def test_two_containers_of_one_pipeline_one_runs_the_other_exits_3(
    image: str, data: Path, s3_location: StoreLocation
) -> None:
    env = {**job_env(s3_location.uri), **s3_location.env, "TINY_TAP_COUNT": "40"}
    env["TINY_TAP_SLEEP"] = "0.3"  # 12 s of job: the second container starts well within it
    secret = s3_location.options["aws_secret_access_key"].encode()
    names = [f"ms-race-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with (
        started(data, env, name=names[0], network="host") as one,
        started(data, env, name=names[1], network="host") as two,
    ):
        first_done = wait_first([one, two])
        _, err = first_done.communicate(timeout=SLOW)
        assert first_done.returncode == 3, err
        other, other_name = (two, names[1]) if first_done is one else (one, names[0])
        inspected = engine("inspect", "--format", "{{.Config.Hostname}}", other_name)
        holder_host = inspected.stdout.decode().strip()
        assert holder_host, inspected.stderr
        # one JSON line says it is busy, naming the holder: the other container
        (busy,) = [e for e in json_log(err) if "is busy" in e["message"]]
        assert "held by run " in busy["message"], busy
        assert f"on host {holder_host} " in busy["message"], busy
        assert secret not in err
        # the other one holds the lease now: its record names it and keeps no secret
        record = bucket_bytes(s3_location)
        assert holder_host.encode() in record, record
        assert secret not in record
        _, err = other.communicate(timeout=SLOW)
        assert other.returncode == 0, err
        assert secret not in err
        json_log(err)
    assert secret not in bucket_bytes(s3_location)


def wait_first(procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    found: list[subprocess.Popen[bytes]] = []

    def one_ended() -> bool:
        found.extend(p for p in procs if p.poll() is not None)
        return bool(found)

    wait_until(one_ended, "one of the two containers to end", timeout=SLOW)
    return found[0]


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_stop_in_the_middle_commits_what_the_target_confirmed(image: str, data: Path) -> None:
    env = job_env("file:///data/store", TINY_TAP_COUNT="1000", TINY_TAP_SLEEP="0.1")
    name = f"ms-stop-{uuid.uuid4().hex[:8]}"
    with started(data, env, name=name) as job:
        wait_until(lambda: lines(data / "out.jsonl") >= 3, "three records written", SLOW)
        stopped = engine("stop", "--time", "30", name)
        assert stopped.returncode == 0, stopped.stderr
        _, err = job.communicate(timeout=SLOW)
    assert job.returncode == 143, err  # SIGTERM's code, passed on by tini
    written = lines(data / "out.jsonl")
    committed = stored_state(data / "store", "prod:tiny")["bookmarks"]["s"]
    # the last state the target printed: the one after its last record, or the one before
    assert written - 1 <= committed <= written, (committed, written)
    assert committed < 1000
    # the lease is free: the next run does not wait for it, and starts where it stopped
    again = run(data, {**env, "TINY_TAP_COUNT": "1", "TINY_TAP_SLEEP": "0"})
    assert again.returncode == 0, again.stderr
    assert tap_got(data) == {"bookmarks": {"s": committed}}


#: a target that takes longer to end than the grace period: it ignores SIGTERM, and once
#: its input ends it goes on "flushing"
SLOW_TARGET = "sh -c 'trap \"\" TERM; python /fixtures/tiny_target.py /data/out.jsonl; sleep 300'"


def test_sigkill_after_the_grace_period_leaves_the_lease_to_expire(image: str, data: Path) -> None:
    env = job_env("file:///data/store", TINY_TAP_COUNT="1000", TINY_TAP_SLEEP="0.1")
    env.update(
        MAPPER_STATE_TARGET=SLOW_TARGET, MAPPER_STATE_STATE_BACKEND__LOCK_TIMEOUT_SECONDS="6"
    )
    name = f"ms-kill-{uuid.uuid4().hex[:8]}"
    with started(data, env, name=name) as job:
        wait_until(lambda: lines(data / "out.jsonl") >= 3, "three records written", SLOW)
        host = engine("inspect", "--format", "{{.Config.Hostname}}", name).stdout.decode()
        stopped = engine("stop", "--time", "2", name)
        assert stopped.returncode == 0, stopped.stderr
        job.communicate(timeout=SLOW)
    assert job.returncode == 137  # SIGKILL: the grace period ran out
    # nothing released the lease: its record still names the killed container
    status = subprocess.run(
        [MAPPER, "lock", "status", "prod:tiny", "--format", "json"],
        env={**clean_env(), "MAPPER_STATE_STATE_BACKEND__URI": f"file://{data / 'store'}"},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert status.returncode == 0, status.stderr
    assert host.strip() in status.stdout.decode(), status.stdout
    committed = stored_state(data / "store", "prod:tiny")
    # once the lease has expired (its TTL: 6 s), a run takes it over and goes on (before
    # that, a run is refused with 3)
    quick = job_env("file:///data/store", TINY_TAP_COUNT="1")
    quick["MAPPER_STATE_STATE_BACKEND__LOCK_TIMEOUT_SECONDS"] = "6"
    results: list[subprocess.CompletedProcess[bytes]] = []

    def a_run_goes_through() -> bool:
        results.append(run(data, quick))
        return results[-1].returncode == 0

    wait_until(a_run_goes_through, "a run after the lease expired", SLOW)
    assert {r.returncode for r in results[:-1]} <= {3}, [r.stderr for r in results]
    messages = [e["message"] for e in json_log(results[-1].stderr)]
    assert any(m.startswith("took over the expired lease of run ") for m in messages), messages
    assert tap_got(data) == (committed or {})


ORPHANING_TAP = """\
import json, subprocess, sys, time
print(json.dumps({"type": "SCHEMA", "stream": "s", "schema": {}, "key_properties": []}), flush=True)
for i in range(1, 400):
    # a child that leaves a grandchild behind: the grandchild ends an orphan
    subprocess.run(["sh", "-c", "sleep 0.05 & exit 0"], check=True)
    print(json.dumps({"type": "RECORD", "stream": "s", "record": {"i": i}}), flush=True)
    print(json.dumps({"type": "STATE", "value": {"bookmarks": {"s": i}}}), flush=True)
    time.sleep(0.1)
"""

PROCESSES = "for f in /proc/[0-9]*/status; do cat $f; echo; done"


def processes(name: str, job: subprocess.Popen[bytes]) -> list[dict[str, str]]:
    """Each process in the container of ``job``: its status fields (Name, State, Uid...).

    Podman's ``exec`` can fail while the container runs on ("does not exist in
    database", once in a loaded full suite): it is asked again while the job runs; a job
    that has ended fails the test with its own output."""
    for _ in range(3):
        listed = engine("exec", name, "sh", "-c", PROCESSES)
        if listed.returncode == 0 or job.poll() is not None:
            break
        time.sleep(1)
    if job.poll() is not None:
        out, err = job.communicate()
        pytest.fail(f"the job ended early ({job.returncode}): {(out + err)[-3000:]!r}")
    assert listed.returncode == 0, listed.stderr
    found = []
    for block in listed.stdout.decode().split("\n\n"):
        fields = dict(line.split(":\t", 1) for line in block.splitlines() if ":\t" in line)
        if fields:
            found.append(fields)
    return found


@pytest.mark.parametrize(
    "pid1", ["tini", "mapper-state"], ids=["image-entrypoint", "without-tini-control"]
)
def test_no_zombie_remains_while_the_job_runs(image: str, data: Path, pid1: str) -> None:
    (data / "tap.py").write_text(ORPHANING_TAP)
    env = job_env("file:///data/store", MAPPER_STATE_TAP="python /data/tap.py")
    name = f"ms-zombie-{uuid.uuid4().hex[:8]}"
    command = ["run"] if pid1 == "tini" else ["--entrypoint", "mapper-state", IMAGE, "run"]
    args = [*run_args(data, env, name=name)]
    args += [IMAGE, *command] if pid1 == "tini" else command
    proc = subprocess.Popen(
        args, env=container_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_until(lambda: lines(data / "out.jsonl") >= 10, "ten records (ten orphans)", SLOW)
        seen = processes(name, proc)
        wait_until(lambda: lines(data / "out.jsonl") >= 13, "three more records", SLOW)
        later = processes(name, proc)
    finally:
        engine("stop", "--time", "10", name)
        proc.communicate(timeout=SLOW)
    # a zombie that remains: there in both looks (not one caught between exit and reaping)
    zombie_pids = {p["Pid"] for p in later if p["State"].startswith("Z")}
    zombies = [p for p in seen if p["State"].startswith("Z") and p["Pid"] in zombie_pids]
    if pid1 == "tini":
        assert zombies == [], zombies
        names = {p["Name"] for p in seen}
        assert {"tini", "mapper-state", "python"} <= names, names
        # every process of the job runs as the image's user
        assert {p["Uid"].split()[0] for p in seen} == {"10001"}, seen
    else:  # the check sees them where nobody reaps them: mapper-state as PID 1 does not
        assert len(zombies) >= 5, seen


EXEC_SCRIPT = """\
#!/bin/sh
# an ELT command: a nested `mapper-state run` writes the state under exec's lease
set -e
echo "elt: started" >&2
mapper-state run
echo "elt: done" >&2
"""


def test_exec_entrypoint_holds_the_lease_for_the_command(image: str, data: Path) -> None:
    (data / "elt.sh").write_text(EXEC_SCRIPT)
    env = job_env("file:///data/store")
    exec_command = ["exec", "--", "sh", "/data/elt.sh"]
    first = run(data, env, *exec_command)
    assert first.returncode == 0, first.stderr
    second = run(data, env, *exec_command)
    assert second.returncode == 0, second.stderr
    assert tap_got(data) == {"bookmarks": {"s": 3}}
    assert stored_state(data / "store", "prod:tiny") == {"bookmarks": {"s": 6}}
    # a second container while the first one's command runs: exit 3, its command never starts
    slow = {**env, "TINY_TAP_COUNT": "1000", "TINY_TAP_SLEEP": "0.1"}
    name = f"ms-exec-{uuid.uuid4().hex[:8]}"
    with started(data, slow, *exec_command, name=name) as holder:
        wait_until(lambda: lines(data / "out.jsonl") >= 8, "the first command's records", SLOW)
        busy = run(data, slow, "exec", "--", "sh", "-c", "echo started >/data/second")
        assert busy.returncode == 3, busy.stderr
        assert not (data / "second").exists()
        holder_host = engine("inspect", "--format", "{{.Config.Hostname}}", name).stdout.decode()
        (said,) = [e for e in json_log(busy.stderr) if "is busy" in e["message"]]
        assert f"on host {holder_host.strip()} " in said["message"], said
        stopped = engine("stop", "--time", "30", name)
        assert stopped.returncode == 0, stopped.stderr
        holder.communicate(timeout=SLOW)
    assert holder.returncode == 143
    # the command's own status is the container's
    failing = run(data, env, "exec", "--", "sh", "-c", "exit 7")
    assert failing.returncode == 7, failing.stderr
