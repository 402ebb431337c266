"""Requests to an S3 store per run: mapper-state against Meltano's own S3 state backend.

SPEC section 5 asks for few requests: per run one lease acquire, one state read, one
write per checkpoint, renewals and one release. They are counted on the wire, at a
real mitmproxy in front of moto (``benchmarks/wire.py``). Scenarios, each on a fresh
prefix of one bucket:

* the filter over a generated stream (``records`` records, a STATE every
  ``state_every``), fed at full speed and with 0.2 s between STATEs, with
  ``--checkpoint-interval-seconds 0`` and the default 5 s;
* ``mapper-state run`` with the tiny tap and target of the test suite (10 records
  0.2 s apart, a STATE after each, every one confirmed by the target), both intervals;
* Meltano 4.4 with its S3 state backend: ``meltano state set`` once, ``meltano run
  tap-sample target-jsonl`` on a throw-away copy of this project, and the same run with
  mapper-state's ``remote-state`` mapping in the middle, whose lease a detached keeper
  holds until Meltano exits (both tools' requests are counted).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    MAPPER,
    MELTANO,
    ROOT,
    TAP_SAMPLE,
    BenchError,
    Row,
    Scale,
    Section,
    clean_env,
    meltano_project,
    require,
    workdir,
)
from benchmarks.wire import Wire, breakdown, s3_behind_proxy, shown, state_writes

FIXTURES = ROOT / "tests" / "fixtures"
BUCKET = "bench-requests"
RUN_RECORDS = 10  # the tiny tap emits a STATE after each record
PACE = 0.2  # seconds between STATEs in the paced scenarios
STATE_ID = "dev:tap-sample-to-target-jsonl"  # Meltano's, for the sample pipeline
TIMEOUT = 120.0


@dataclass
class Scenario:
    tool: str
    scenario: str
    states_in: str
    requests: list[str]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "scenario": self.scenario,
            "states_in": self.states_in,
            "requests": len(self.requests),
            "state_writes": state_writes(self.requests),
            "kinds": self.requests,
            "seconds": self.seconds,
        }


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
            raise BenchError(f"{' '.join(args[:3])}... exited {child.returncode}:\n{tail}")
    return time.perf_counter() - started


def stream_chunks(records: int, state_every: int) -> list[bytes]:
    """``records`` records with a STATE after every ``state_every``, in chunks ending on a STATE."""
    chunks = []
    lines = [
        '{"type":"SCHEMA","stream":"events","schema":{"type":"object"},"key_properties":["id"]}'
    ]
    for i in range(1, records + 1):
        lines.append(f'{{"type":"RECORD","stream":"events","record":{{"id":{i}}}}}')
        if i % state_every == 0:
            lines.append(f'{{"type":"STATE","value":{{"bookmarks":{{"events":{{"id":{i}}}}}}}}}')
            chunks.append(("\n".join(lines) + "\n").encode())
            lines = []
    return chunks


def check(wire: Wire, prefix: str, state_id: str, expected: Any = None) -> None:
    stored = wire.stored_state(BUCKET, f"{prefix}/{state_id}/state.json")
    if expected is not None and stored != expected:
        raise BenchError(f"s3://{BUCKET}/{prefix}/{state_id} holds {stored}, expected {expected}")


def mapper_scenarios(wire: Wire, work: Path, scale: Scale) -> list[Scenario]:
    env = wire.mapper_env(work)
    chunks = stream_chunks(scale.requests_records, scale.requests_state_every)
    final = {"bookmarks": {"events": {"id": scale.requests_records}}}
    results = []
    for paced, interval in ((False, "5"), (False, "0"), (True, "5"), (True, "0")):
        prefix = f"filter-{'paced' if paced else 'fast'}-{interval}"
        wire.take()
        seconds = run(
            [
                *(MAPPER, "--state-id", "bench:filter", "--state-backend-uri"),
                *(f"s3://{BUCKET}/{prefix}", "--checkpoint-interval-seconds", interval),
            ],
            cwd=work,
            env=env,
            feed=chunks if paced else [b"".join(chunks)],
        )
        kinds = wire.take_kinds()
        check(wire, prefix, "bench:filter", final)
        speed = f"{PACE:g} s between STATEs" if paced else "at full speed"
        scenario = (
            f"filter, {scale.requests_records:,} records {speed}, checkpoint interval {interval} s"
        ) + (" (default)" if interval == "5" else "")
        results.append(Scenario("mapper-state", scenario, str(len(chunks)), kinds, seconds))
    run_env = {**env, "TINY_TAP_COUNT": str(RUN_RECORDS), "TINY_TAP_SLEEP": str(PACE)}
    for interval in ("5", "0"):
        prefix = f"run-{interval}"
        wire.take()
        seconds = run(
            [
                *(MAPPER, "run", "--state-id", "bench:run", "--state-backend-uri"),
                *(f"s3://{BUCKET}/{prefix}", "--checkpoint-interval-seconds", interval),
                *("--tap", f"{sys.executable} {FIXTURES / 'tiny_tap.py'}"),
                *(
                    "--target",
                    f"{sys.executable} {FIXTURES / 'tiny_target.py'} {work / prefix}.out",
                ),
            ],
            cwd=work,
            env=run_env,
        )
        kinds = wire.take_kinds()
        check(wire, prefix, "bench:run", {"bookmarks": {"s": RUN_RECORDS}})
        scenario = (
            f"`run`, tiny tap and target, {RUN_RECORDS} records {PACE:g} s apart, "
            f"checkpoint interval {interval} s"
        ) + (" (default)" if interval == "5" else "")
        results.append(
            Scenario("mapper-state", scenario, f"{RUN_RECORDS}, all confirmed", kinds, seconds)
        )
    return results


def tap_states(project: Path, work: Path, state_every: int) -> int:
    """How many STATE messages tap-sample emits over the project's data file."""
    config = work / "tap-sample.json"
    data = project / "examples" / "data" / "events.jsonl"
    config.write_text(json.dumps({"data_path": str(data), "state_message_frequency": state_every}))
    out = subprocess.run(
        [TAP_SAMPLE, "--config", str(config)],
        capture_output=True,
        check=True,
        timeout=TIMEOUT,
        env=clean_env(work),
    ).stdout
    return sum(1 for line in out.splitlines() if b'"type":"STATE"' in line.replace(b" ", b""))


def wait_released(
    wire: Wire, work: Path, uri: str, state_id: str, seen: list[str], timeout: float = 30
) -> None:
    """Collect requests into ``seen`` until the detached keeper has released the lease.

    Whether the lease is free is asked of moto directly (``lock status`` not through the
    proxy), so the asking is not counted.
    """
    env = wire.mapper_env(work)
    env["MAPPER_STATE_STATE_BACKEND__S3__ENDPOINT_URL"] = wire.direct
    deadline = time.monotonic() + timeout
    while True:
        status = subprocess.run(
            [MAPPER, "lock", "status", state_id, "--format", "json", "--state-backend-uri", uri],
            capture_output=True,
            env=env,
            timeout=TIMEOUT,
            check=False,
        )
        seen += wire.take_kinds()
        if status.stdout and json.loads(status.stdout).get("free"):
            break
        if time.monotonic() > deadline:
            raise BenchError(f"the lease on {state_id} was not released within {timeout:g} s")
        time.sleep(0.2)
    time.sleep(0.5)  # nothing is expected after it; catch a straggler if there is one
    seen += wire.take_kinds()


def meltano_scenarios(wire: Wire, work: Path, scale: Scale) -> list[Scenario]:
    project = meltano_project(work, scale.requests_records)
    meltano = [MELTANO, "--log-level=warning"]
    results = []

    prefix, state = "meltano-set", {"bookmarks": {"events": {"id": 1}}}
    wire.take()
    seconds = run(
        [*meltano, "state", "set", "--force", "dev:bench", json.dumps({"singer_state": state})],
        cwd=project,
        env=wire.meltano_env(work, f"s3://{BUCKET}/{prefix}"),
    )
    kinds = wire.take_kinds()
    check(wire, prefix, "dev:bench", state)
    results.append(Scenario("Meltano 4.4", "`meltano state set`", "1", kinds, seconds))

    every = scale.requests_state_every
    states = f"{tap_states(project, work, every)} from the tap, 1 confirmed by target-jsonl"
    rows = f"{scale.requests_records:,} rows"
    for prefix, scenario, plugins in (
        ("meltano-run", f"`meltano run tap-sample target-jsonl`, {rows}", []),
        (
            "meltano-mapping",
            f"`meltano run tap-sample remote-state target-jsonl`, {rows}: "
            "mapper-state's lease (lock_only) kept until Meltano exits",
            ["remote-state"],
        ),
    ):
        env = wire.meltano_env(
            work,
            f"s3://{BUCKET}/{prefix}",
            TAP_SAMPLE_STATE_MESSAGE_FREQUENCY=str(every),
        )
        wire.take()
        seconds = run(
            [*meltano, "run", "tap-sample", *plugins, "target-jsonl"], cwd=project, env=env
        )
        seen = wire.take_kinds()
        if plugins:
            # the keeper releases after Meltano exits
            wait_released(wire, work, f"s3://{BUCKET}/{prefix}", STATE_ID, seen)
        check(wire, prefix, STATE_ID)
        tool = "Meltano 4.4 + mapper-state" if plugins else "Meltano 4.4"
        results.append(Scenario(tool, scenario, states, seen, seconds))
    return results


NOTE = (
    "Requests counted at mitmproxy in front of moto's S3, each as its method and the kind "
    "of key: `state.json`; `lease` is mapper-state's `<state_id>/mapper-state.lease.json`, "
    "`lock` Meltano's `<state_id>/lock`, `history` a run's snapshot under "
    "`<state_id>/history/` (`history_keep`, default 20); `LIST history/` lists those "
    "snapshots. `(multipart)` requests are smart_open's uploads (start, part, complete: "
    "3 requests per object written); `(batch)` is a DeleteObjects request. mapper-state's "
    "lease TTL is the default 30 s, renewed every 10 s and before each state write "
    "(fencing). The release is a compare-and-swap to a released record (one more `PUT "
    "lease`) because moto is reached through an `endpoint_url`, where mapper-state does "
    "not trust a conditional delete to be checked; on AWS S3 itself it is one conditional "
    "`DELETE lease`. With a checkpoint interval of 0 a state is written whenever the previous "
    "write is done: states that arrive meanwhile (or while mapper-state starts) are "
    "coalesced. In the last row, `lease` requests and one `GET state.json` are "
    "mapper-state's, the rest Meltano's."
)


def measure(scale: Scale, progress: Callable[[str], None]) -> Section:
    require(MAPPER, MELTANO, TAP_SAMPLE)
    section = Section("requests", "Requests to S3 per run, against Meltano's S3 backend")
    with workdir("requests") as work, s3_behind_proxy() as wire:
        wire.create_bucket(BUCKET)
        progress("mapper-state's scenarios")
        results = mapper_scenarios(wire, work, scale)
        progress("Meltano's scenarios")
        results += meltano_scenarios(wire, work, scale)
    section.data["scenarios"] = [r.as_dict() for r in results]
    section.rows = [
        Row(
            f"{r.tool}: {r.scenario}",
            f"{len(r.requests)} requests",
            f"{state_writes(r.requests)} state.json writes; STATE messages: {r.states_in}",
            breakdown(shown(k) for k in r.requests),
        )
        for r in results
    ]
    section.notes.append(NOTE)
    return section
