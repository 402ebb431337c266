"""Meltano's S3 state backend against mapper-state's add-on (``mapper-state+s3://``).

Counted on the wire, at mitmproxy in front of moto (``benchmarks/wire.py``), with Meltano
4.4 run from a virtualenv that sees Meltano's packages and holds this checkout (what
``pip install mapper-state`` into Meltano's venv gives):

* requests per ``meltano state set`` and per ``meltano run tap-sample target-jsonl``;
* ``meltano state list`` over 5,000 state IDs (requests and seconds);
* the merge race: rounds of concurrent ``meltano state merge`` (8 at the default scale, 2
  at the smoke test's), each adding its own stream; streams lost per backend.
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import (
    MELTANO,
    ROOT,
    TAP_SAMPLE,
    BenchError,
    Row,
    Scale,
    Section,
    meltano_project,
    require,
    workdir,
)
from benchmarks.wire import Wire, breakdown, s3_behind_proxy, seed, shown

BUCKET = "bench-backend"
TIMEOUT = 600.0
BACKENDS = (("Meltano's S3 backend", "s3"), ("mapper-state's add-on", "mapper-state+s3"))


def addon_meltano(work: Path) -> str:
    """``meltano`` of a venv with Meltano's packages and this checkout installed."""
    real = Path(MELTANO)
    site = next((real.parent.parent / "lib").glob("python3*/site-packages"))
    venv = work / "meltano-addon"
    python = str(real.parent / "python")
    for argv in (
        ["uv", "venv", "--quiet", "--python", python, str(venv)],
        [
            "uv",
            "pip",
            "install",
            "--quiet",
            "--compile-bytecode",
            "--python",
            str(venv / "bin" / "python"),
            f"{ROOT}[s3]",
        ],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BenchError(f"{' '.join(argv[:3])} failed: {result.stderr[-2000:]}")
    (next((venv / "lib").glob("python3*/site-packages")) / "zz-meltano.pth").write_text(f"{site}\n")
    launcher = venv / "bin" / "meltano"
    launcher.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom meltano.cli import main\nsys.exit(main())\n"
    )
    launcher.chmod(0o755)
    return str(launcher)


def _meltano(
    meltano: str, project: Path, env: dict[str, str], *args: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [meltano, "--log-level=warning", *args],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _done(proc: subprocess.Popen[bytes]) -> None:
    _, err = proc.communicate(timeout=TIMEOUT)
    if proc.returncode != 0:
        raise BenchError(
            f"meltano exited {proc.returncode}: {err.decode(errors='replace')[-2000:]}"
        )


def _count(wire: Wire, run: Callable[[], None]) -> tuple[list[str], float]:
    wire.take()
    started = time.perf_counter()
    run()
    return wire.take_kinds(), time.perf_counter() - started


def _lost(wire: Wire, prefix: str, state_id: str, writers: int) -> int:
    """Streams missing from the state after the race (``partial`` merged over ``completed``,
    as Meltano reads it: its merges write the partial state)."""
    from mapper_state.core.state import singer_state

    body = wire.client().get_object(Bucket=BUCKET, Key=f"{prefix}/{state_id}/state.json")["Body"]
    value = singer_state(json.loads(body.read())) or {}
    return writers - len(value.get("bookmarks", {}))


def _figures(
    wire: Wire, meltano: str, project: Path, work: Path, scheme: str, scale: Scale
) -> dict[str, tuple[list[str], float]]:
    """One backend's figures: ``{measure: (requests, seconds)}``; the race's in ``lost``."""
    prefix = scheme.replace("+", "-")
    env = wire.meltano_env(work, f"{scheme}://{BUCKET}/{prefix}")
    state = json.dumps({"singer_state": {"bookmarks": {"events": {"id": 1}}}})
    found: dict[str, tuple[list[str], float]] = {}
    ids, rounds = scale.backend_list_ids, race_rounds(scale)
    for what, args in (
        ("`meltano state set`", ("state", "set", "--force", "dev:bench", state)),
        ("`meltano run tap-sample target-jsonl`", ("run", "tap-sample", "target-jsonl")),
    ):
        found[what] = _count(wire, functools.partial(_run, meltano, project, env, *args))
    doc = json.dumps({"completed": {"singer_state": {"bookmarks": {}}}, "partial": {}}).encode()
    seed(wire, BUCKET, ((f"{prefix}-list/dev:tap-{i:04d}/state.json", doc) for i in range(ids)))
    list_env = wire.meltano_env(work, f"{scheme}://{BUCKET}/{prefix}-list")
    found[f"`meltano state list`, {ids:,} IDs"] = _count(
        wire, functools.partial(_run, meltano, project, list_env, "state", "list")
    )
    lost = 0
    for r in range(rounds):
        procs = [
            _meltano(
                meltano,
                project,
                env,
                "state",
                "merge",
                f"dev:race-{r}",
                json.dumps({"singer_state": {"bookmarks": {f"s{n}": {"id": n}}}}),
            )
            for n in range(scale.race_writers)
        ]
        failed = [p for p in procs if p.communicate(timeout=TIMEOUT) and p.returncode != 0]
        lost += _lost(wire, prefix, f"dev:race-{r}", scale.race_writers)
        if failed:
            raise BenchError(f"{len(failed)} of the concurrent merges on {scheme} failed")
    found["lost"] = ([], float(lost))
    return found


def race_rounds(scale: Scale) -> int:
    return max(1, scale.requests_records // 200)


def _run(meltano: str, project: Path, env: dict[str, str], *args: str) -> None:
    _done(_meltano(meltano, project, env, *args))


def measure(scale: Scale, progress: Callable[[str], None]) -> Section:
    require(MELTANO, TAP_SAMPLE)
    section = Section("meltano-backend", "Meltano's S3 state backend against mapper-state's add-on")
    rounds = race_rounds(scale)
    with workdir("meltano-backend") as work, s3_behind_proxy() as wire:
        wire.create_bucket(BUCKET)
        progress("installing the add-on into a copy of Meltano's environment")
        meltano = addon_meltano(work)
        project = meltano_project(work, scale.requests_records)
        figures = {}
        for label, scheme in BACKENDS:
            progress(f"{label}: state set, run, list, merge race")
            figures[scheme] = _figures(wire, meltano, project, work, scheme, scale)
    theirs, ours = figures["s3"], figures["mapper-state+s3"]
    for what in (k for k in ours if k != "lost"):
        (mine, my_s), (base, base_s) = ours[what], theirs[what]
        section.rows.append(
            Row(
                f"{what}: add-on (Meltano's S3 backend)",
                f"{len(mine)} requests, {my_s:.1f} s",
                f"{len(base)} requests, {base_s:.1f} s",
                f"{breakdown(shown(k) for k in mine)} ({breakdown(shown(k) for k in base)})",
            )
        )
        section.data[what] = {"addon": mine, "meltano": base, "seconds": [my_s, base_s]}
    lost_ours, lost_theirs = int(ours["lost"][1]), int(theirs["lost"][1])
    section.rows.append(
        Row(
            f"{rounds} round(s) of {scale.race_writers} concurrent `meltano state merge`: streams lost",
            str(lost_ours),
            str(lost_theirs),
            f"of {rounds * scale.race_writers}",
        )
    )
    section.data["race"] = {
        "rounds": rounds,
        "writers": scale.race_writers,
        "addon": lost_ours,
        "meltano": lost_theirs,
    }
    section.notes.append(
        "Requests counted at mitmproxy in front of moto; both backends configured only by "
        "MELTANO_STATE_BACKEND_URI and Meltano's MELTANO_STATE_BACKEND_S3_* variables. "
        "The add-on's writes include the lease (create, renewal before the write, release) "
        "and a history snapshot."
    )
    return section
