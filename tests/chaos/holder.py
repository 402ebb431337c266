"""One contender for a lease, run as its own process by the mutual-exclusion tests.

``python -m tests.chaos.holder SPEC.json OUT.jsonl`` loops ``rounds`` times: take the
lease with the real :class:`~mapper_state.core.lease.Lease` on a store opened by the
registry (waiting as ``lock_wait_seconds`` would), hold it a few milliseconds, confirm it
(a compare-and-swap renewal: proof that nobody took it meanwhile), then release it. Each
round appends one JSON line to OUT:

``{"log", "pid", "round", "run_id", "kind", "got", "until", "errors", "conflict", "counted"}``

``kind`` is ``held`` (``[got, until)`` was held: ``got`` just after the acquire
returned, ``until`` just after the confirming renewal succeeded, both ``time.time()``
on this host), ``abandoned`` (the holder "crashed": it kept the lease without releasing
or renewing it, so it expires; ``until`` is taken before it walks away), ``lapsed`` (the
heartbeat gave the lease up at its renewal deadline: the store did not answer the
renewals in time), or ``lost`` (the confirming renewal found the lease gone: someone took
a lease that had not expired). ``errors`` counts store errors met in the round (faults on
the wire); ``why`` is the message of a round that was not ``held``.

With ``"cli": true`` the holder is the real ``mapper-state run`` instead, whose tap and
target are this same script (``tap``/``target`` sub-modes): the tap writes the time it
started, the target the time it read the end of its input, so ``[got, until)`` lies
inside the time the command held the lease.

The spec (JSON): ``uri``, ``section``, ``options``, ``env`` (for the store), ``state_id``,
``ttl``, ``retry``, ``rounds``, ``hold_ms`` (a random hold up to it) or ``hold_seconds``
(exactly), ``abandon_rate``, ``seed``, ``clock_skew`` (seconds added to this holder's wall
clock, through the ``Lease`` class's ``clock``), ``start_after`` (seconds), ``cli``, and
``log`` (this holder's index, copied into every line).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LOG_INDEX: int | None = None  # the spec's "log": which holder of the test this is


def _line(out: Any, **fields: Any) -> None:
    out.write(json.dumps({"log": LOG_INDEX, **fields}) + "\n")
    out.flush()


def count_up(store: Any, state_id: str) -> tuple[int, bool, bool]:
    """Add one to the shared counter in the state, as a run would: read, then a fenced write.

    Only a holder writes, so after an ambiguous failure reading the state back tells
    whether the write landed. Returns the store errors met, whether the write was
    refused because the state had changed behind the holder's back (which, under a
    lease that is truly exclusive, never happens), and whether the counter moved.
    """
    from mapper_state.core import state
    from mapper_state.errors import LeaseLost
    from mapper_state.stores.base import StoreError

    errors = 0
    for _ in range(20):
        try:
            snapshot = state.load(store, state_id)
            break
        except StoreError:
            errors += 1
    else:
        return errors, False, False
    value = {"n": int((snapshot.value or {}).get("n", 0)) + 1}
    for _ in range(20):
        try:
            state.save(store, state_id, value, snapshot.version)
            return errors, False, True
        except LeaseLost:
            return errors, True, False
        except StoreError:
            errors += 1
            try:
                now = state.load(store, state_id)
            except StoreError:
                continue
            if now.value == value:
                return errors, False, True  # the failed attempt had landed
            if now.version != snapshot.version:
                return errors, True, False
    return errors, False, False


def lease_rounds(spec: dict[str, Any], out_path: str) -> int:
    os.environ.update(spec.get("env", {}))
    from mapper_state.core.lease import Lease
    from mapper_state.errors import LeaseBusy, LeaseLapsed, LeaseLost
    from mapper_state.stores import open_store
    from mapper_state.stores.base import StoreError

    ttl = float(spec["ttl"])
    store = open_store(  # as the registry opens it for a run
        spec["uri"], {spec["section"]: spec.get("options", {})}, retry_deadline_seconds=ttl / 3
    )
    rng = random.Random(spec.get("seed", 0))
    skew = float(spec.get("clock_skew", 0.0))

    def clock() -> float:
        return time.time() + skew

    time.sleep(float(spec.get("start_after", 0.0)))
    with open(out_path, "a", encoding="utf-8") as out:
        done = 0
        while done < int(spec["rounds"]):
            errors = 0
            lease = Lease(
                store,
                spec["state_id"],
                ttl=ttl,
                retry=float(spec["retry"]),
                wait=float(spec.get("wait", 300)),
                command="chaos-holder",
                clock=clock,
            )
            try:
                lease.acquire()
            except (StoreError, LeaseBusy):
                errors += 1
                time.sleep(rng.uniform(0, float(spec["retry"])))
                continue
            got = time.time()
            lease.start_heartbeat()
            if "hold_seconds" in spec:
                time.sleep(float(spec["hold_seconds"]))
            else:
                time.sleep(rng.uniform(0, float(spec["hold_ms"]) / 1000))
            count_errors, conflict, counted = count_up(store, spec["state_id"])
            errors += count_errors
            if rng.random() < float(spec.get("abandon_rate", 0.0)):
                until = time.time()
                lease.stop_heartbeat()  # walk away: no renewal, no release
                _line(
                    out, pid=os.getpid(), round=done, run_id=lease.run_id, kind="abandoned",
                    got=got, until=until, errors=errors, conflict=conflict, counted=counted,
                )  # fmt: skip
                done += 1
                continue
            kind, why = "held", ""
            for _ in range(5):
                try:
                    lease.confirm()
                    break
                except LeaseLost as exc:
                    kind, why = "lapsed" if isinstance(exc, LeaseLapsed) else "lost", exc.message
                    break
                except StoreError as exc:
                    errors += 1
                    why = exc.message
            else:
                kind = "unconfirmed"
            until = time.time()
            try:
                lease.release()
            except StoreError:
                errors += 1
            _line(
                out, pid=os.getpid(), round=done, run_id=lease.run_id, kind=kind,
                got=got, until=until, errors=errors, conflict=conflict, counted=counted,
                why=why if kind != "held" else "",
            )  # fmt: skip
            done += 1
    return 0


def cli_rounds(spec: dict[str, Any], out_path: str) -> int:
    """Each round is one ``mapper-state run`` whose tap and target stamp the held interval."""
    mapper = str(Path(sys.executable).parent / "mapper-state")
    env = {**os.environ, **spec["env"]}
    me = [sys.executable, "-m", "tests.chaos.holder"]
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root
    stamps = Path(out_path).with_suffix(".stamps")
    with open(out_path, "a", encoding="utf-8") as out:
        for round_ in range(int(spec["rounds"])):
            stamps.unlink(missing_ok=True)
            tap = shlex.join([*me, "tap", str(stamps)])
            target = shlex.join([*me, "target", str(stamps)])
            started = time.time()
            proc = subprocess.run(
                [
                    mapper, "run", "--state-id", spec["state_id"],
                    "--tap", tap, "--target", target,
                    "--lock-timeout-seconds", str(spec["ttl"]),
                    "--lock-retry-seconds", str(spec["retry"]),
                    "--lock-wait-seconds", str(spec.get("wait", 300)),
                    "--checkpoint-interval-seconds", "0",
                ],
                env=env, capture_output=True, cwd=root, timeout=600, check=False,
            )  # fmt: skip
            marks = stamps.read_text().split() if stamps.exists() else []
            got = float(marks[0]) if len(marks) > 0 else None
            until = float(marks[1]) if len(marks) > 1 else None
            _line(
                out, pid=os.getpid(), round=round_, run_id="", got=got, until=until,
                kind="held" if proc.returncode == 0 and until else f"exit {proc.returncode}",
                errors=0, started=started, ended=time.time(),
                stderr=proc.stderr.decode(errors="replace")[-500:] if proc.returncode else "",
            )  # fmt: skip
    return 0


def tap(stamps: str) -> int:
    """The tap of a CLI round: stamp its start, emit one record and one state."""
    with open(stamps, "w", encoding="utf-8") as f:
        f.write(f"{time.time()!r}\n")
    prior = {}
    if "--state" in sys.argv:
        with open(sys.argv[sys.argv.index("--state") + 1], encoding="utf-8") as f:
            prior = json.load(f)
    n = int(prior.get("n", 0)) + 1
    print(json.dumps({"type": "SCHEMA", "stream": "s", "schema": {}, "key_properties": []}))
    print(json.dumps({"type": "RECORD", "stream": "s", "record": {"n": n}}))
    print(json.dumps({"type": "STATE", "value": {"n": n}}), flush=True)
    time.sleep(0.02)
    return 0


def target(stamps: str) -> int:
    """The target of a CLI round: confirm each state, stamp the end of its input."""
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("type") == "STATE":
            print(json.dumps(message["value"]), flush=True)
    with open(stamps, "a", encoding="utf-8") as f:
        f.write(f"{time.time()!r}\n")
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "tap":
        return tap(argv[1])
    if argv[0] == "target":
        return target(argv[1])
    global LOG_INDEX
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    LOG_INDEX = spec.get("log")
    return (cli_rounds if spec.get("cli") else lease_rounds)(spec, argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
