"""A whole ``meltano run`` under one lease, with only ``state_backend.uri: mapper-state+...``.

Meltano 4.4.1 with the project's wheel in its venv (the ``meltano_addon`` fixture), no mapper
plugin in the pipeline: tap-sample (through a wrapper that records each start of the tap),
target-jsonl, and a ``gate`` utility after the EL block that marks its start and waits for
the test to open it. Each "machine" is a Meltano project of its own (its own system
database) on one shared store: the local store, or S3 (moto).

The gate makes the overlap certain: the run that takes the lease stays in its gate step
until the other has been judged, so a second run is either refused or is a bug (both runs
would then wait at their gates, and the wait for the first exit fails the test).

``MAPPER_STATE_MELTANO_RUN_ROUNDS`` sets the rounds of the peer test (default 2; the figure
in docs/meltano.md is from 5); ``-s`` shows each round.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mapper_state.core import history
from mapper_state.core.lease import LeaseRecord, read_lease
from tests.e2e import tools
from tests.e2e.test_meltano import add_rows, delivered, rows_of
from tests.e2e.test_meltano_backend import (  # noqa: F401 - fixtures used by name
    HEAVY,
    AddonProject,
    Backend,
    backend,
    file_backend,
    meltano_addon,
    run_project,
)
from tests.support import meltano_fork
from tests.support.processes import pid_alive, wait_until

pytestmark = pytest.mark.e2e

ROUNDS = int(os.environ.get("MAPPER_STATE_MELTANO_RUN_ROUNDS", "2"))
EL = ("tap-sample", "target-jsonl")
GATE = "gate:wait"
STATE_ID = "dev:tap-sample-to-target-jsonl"
BUSY = 3  # LEASE_BUSY


@dataclass
class Machine:
    """One Meltano project (one system database) on the shared store."""

    project: AddonProject
    go: Path

    @property
    def started(self) -> Path:
        return self.project.root / "gate-started"

    def gate_pid(self) -> int:
        """The pid of the gate step (once it has started)."""
        wait_until(lambda: self.started.read_text().strip(), "the gate never said its pid", 30)
        return int(self.started.read_text())

    @property
    def taps(self) -> Path:
        return self.project.root / "tap-starts"

    @property
    def log(self) -> Path:
        return self.project.root / "run.log"

    def tap_starts(self) -> list[str]:
        return self.taps.read_text().splitlines() if self.taps.exists() else []

    def syncs(self) -> int:
        """Starts of the tap that extract data (not ``--discover``)."""
        return sum("--discover" not in line for line in self.tap_starts())

    def spawn(self, *args: str, new_session: bool = False) -> meltano_fork.Process:
        return meltano_fork.spawn(
            self.project.executable(), args, cwd=self.project.cwd, env=self.project.env,
            log=self.log, new_session=new_session,
        )  # fmt: skip

    def reset(self) -> None:
        for path in (self.started, self.taps, self.log):
            path.unlink(missing_ok=True)


def machine(root: Path, data: Path, launcher: Path, shared: Backend, go: Path) -> Machine:
    """A project running tap-sample through a recording wrapper, with the ``gate`` utility."""
    project = run_project(root, data, launcher, shared)
    taps, started = root / "tap-starts", root / "gate-started"
    wrapper = root / "tap-sample"
    wrapper.write_text(
        f'#!/bin/sh\necho "$$ $*" >> {taps}\nexec {tools.project_bin("tap-sample")} "$@"\n'
    )
    wrapper.chmod(0o755)
    gate = root / "gate.sh"
    gate.write_text('#!/bin/sh\necho $$ > "$1"\nwhile [ ! -e "$2" ]; do sleep 0.05; done\n')
    gate.chmod(0o755)
    doc = yaml.safe_load((root / "meltano.yml").read_text())
    doc["plugins"]["extractors"][0]["executable"] = str(wrapper)
    doc["plugins"]["utilities"] = [
        {
            "name": "gate",
            "namespace": "gate",
            "executable": str(gate),
            "commands": {"wait": {"args": f"{started} {go}"}},
        }
    ]
    (root / "meltano.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return Machine(project, go)


def machines(tmp_path: Path, launcher: Path, shared: Backend, count: int = 2) -> list[Machine]:
    data = tmp_path / "events.jsonl"
    add_rows(data, 10)
    go = tmp_path / "go"
    return [machine(tmp_path / f"machine-{n}", data, launcher, shared, go) for n in range(count)]


def lease_of(shared: Backend, state_id: str = STATE_ID) -> LeaseRecord | None:
    store = shared.open()
    try:
        return read_lease(store, state_id)[0]
    finally:
        store.close()


def held_by(shared: Backend, pid: int, state_id: str = STATE_ID) -> LeaseRecord:
    record = lease_of(shared, state_id)
    assert record is not None, f"no lease on {state_id}"
    assert record.held, record
    assert record.pid == pid, record
    return record


def free(shared: Backend, state_id: str = STATE_ID) -> bool:
    record = lease_of(shared, state_id)
    return record is None or record.is_expired(time.time())


def first_exit(procs: list[meltano_fork.Process], timeout: float = 300) -> int:
    """The index of the first process to end."""
    wait_until(lambda: any(p.poll() is not None for p in procs), "neither run ended", timeout)
    return next(i for i, p in enumerate(procs) if p.poll() is not None)


def refused_line(log: str, holder_pid: int) -> None:
    """One line saying the state ID is busy and naming the holder; no traceback."""
    errors = [line for line in log.splitlines() if "mapper-state: error:" in line]
    assert len(errors) == 1, log
    assert f"state ID {STATE_ID} is busy" in errors[0], log
    assert f"(pid {holder_pid})" in errors[0], log
    assert "Traceback" not in log, log


# -- two machines, one pipeline ----------------------------------------------------------------


@dataclass
class Round:
    codes: list[int]
    syncs: list[int]
    starts: list[int]


def race(pair: list[Machine], flags: tuple[str, ...]) -> Round:
    """Both machines start the pipeline at once; the winner waits at its gate until the
    other has ended."""
    go = pair[0].go
    go.unlink(missing_ok=True)
    for m in pair:
        m.reset()
    procs = [m.spawn("run", *flags, *EL, GATE) for m in pair]
    try:
        wait_until(
            lambda: (
                any(p.poll() is not None for p in procs) or all(m.started.exists() for m in pair)
            ),
            "neither run ended",
            300,
        )
        assert not all(m.started.exists() for m in pair), "both runs got past the lease"
        loser = first_exit(procs)
        winner = 1 - loser
        assert procs[loser].returncode == BUSY, pair[loser].log.read_text()
        assert pair[winner].started.exists() or procs[winner].poll() is None
        refused_line(pair[loser].log.read_text(), procs[winner].pid)
    finally:
        go.touch()
        codes = [p.wait(timeout=300) for p in procs]
    return Round(codes, [m.syncs() for m in pair], [len(m.tap_starts()) for m in pair])


@pytest.mark.parametrize("flags", [(), ("--full-refresh",)], ids=["incremental", "full-refresh"])
@pytest.mark.parametrize("backend", HEAVY, indirect=True)
def test_two_machines_start_one_pipeline_at_once_exactly_one_runs(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    backend: Backend,  # noqa: F811
    flags: tuple[str, ...],
) -> None:
    """Rounds of two ``meltano run`` of one pipeline started together on two machines: in
    each, one runs (its tap once, its gate step after the EL block under the lease) and
    the other is refused with exit 3 naming the holder, without starting its tap; no row
    is loaded twice."""
    pair = machines(tmp_path, meltano_addon, backend)
    data = pair[0].project.root.parent / "events.jsonl"
    loads: list[int] = [0, 0]
    ran = refused = 0
    for n in range(ROUNDS):
        if n:
            add_rows(data, 5)
        result = race(pair, flags)
        print(f"round {n + 1} {' '.join(flags)}: exit codes {result.codes}, syncs {result.syncs}")
        assert sorted(result.codes) == [0, BUSY], result
        winner = result.codes.index(0)
        assert result.syncs[winner] == 1, result
        assert result.starts[1 - winner] == 0, result  # the refused run never started its tap
        ran, refused = ran + 1, refused + 1
        rows = [len(delivered(m.project.output)) for m in pair]
        new = [rows[i] - loads[i] for i in range(2)]
        expected = len(rows_of(data)) if flags else (10 if n == 0 else 5)
        assert new[winner] == expected, (new, result)
        assert new[1 - winner] == 0, (new, result)
        loads = rows
        assert free(backend)  # released when the winner's Meltano exited
    print(
        f"{backend.name} {' '.join(flags) or 'incremental'}: {ROUNDS} rounds, ran {ran}, "
        f"refused {refused}"
    )
    if not flags:  # every row exactly once, whichever machine loaded it
        everything = sorted(row for m in pair for row in delivered(m.project.output))
        assert everything == list(range(1, len(rows_of(data)) + 1))


# -- the steps after the EL block; other state IDs; read-only commands -------------------------


def test_a_step_after_the_el_block_holds_the_lease_and_read_only_commands_take_none(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    """Read-only commands write no lease. While the first run is in its utility step after
    the EL block, a second ``run`` and an ``el`` with the same state ID are refused without
    starting their tap, while ``meltano state get/list/export``, ``meltano config``, a dry
    run and a run without state updates (no state ID: not covered) are not."""
    first, second = machines(tmp_path, meltano_addon, file_backend)
    read_only = [("state", "list"), ("state", "get", STATE_ID)]
    if tools.meltano_has("`meltano state export`"):
        read_only.append(("state", "export"))
    read_only += [tools.config_args("list", "meltano"), tools.config_args("print", "tap-sample")]
    for args in read_only:
        assert second.project.meltano("--log-level=warning", *args).returncode == 0, args
    store = file_backend.open()
    try:
        assert list(store.list("")) == []  # not even a released lease left behind
    finally:
        store.close()
    running = first.spawn("run", *EL, GATE)
    try:
        wait_until(first.started.exists, "the first run never reached its gate", 300)
        holder = held_by(file_backend, running.pid)
        assert holder.command.startswith("meltano run tap-sample target-jsonl gate:wait")
        again = second.project.meltano("run", *EL)
        assert again.returncode == BUSY, again.stderr
        refused_line(again.stderr, running.pid)
        el = second.project.meltano("el", *EL, "--state-id", STATE_ID)
        assert el.returncode == BUSY, el.stderr
        refused_line(el.stderr, running.pid)
        assert second.tap_starts() == []
        for args in read_only:
            assert second.project.meltano("--log-level=warning", *args).returncode == 0, args
        dry = second.project.meltano("run", "--dry-run", *EL)
        assert dry.returncode == 0, dry.stderr
        assert second.tap_starts() == []
        stateless = second.project.meltano("run", "--no-state-update", *EL)
        assert stateless.returncode == 0, stateless.stderr
        assert second.syncs() == 1
        now = held_by(file_backend, running.pid)  # the same lease, renewed by its holder only
        assert (now.run_id, now.acquired_at) == (holder.run_id, holder.acquired_at)
    finally:
        first.go.touch()
        assert running.wait(timeout=300) == 0, first.log.read_text()
    assert free(file_backend)


def test_a_suffix_and_an_explicit_state_id_are_leased(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    """``--state-id-suffix`` leases ``<env>:<tap>-to-<target>:<suffix>`` (and only it);
    ``meltano el --state-id X`` leases X."""
    first, second = machines(tmp_path, meltano_addon, file_backend)
    suffixed = f"{STATE_ID}:nightly"
    running = first.spawn("run", "--state-id-suffix", "nightly", *EL, GATE)
    try:
        wait_until(first.started.exists, "the first run never reached its gate", 300)
        held_by(file_backend, running.pid, suffixed)
        assert lease_of(file_backend) is None  # the unsuffixed pipeline is another one
        busy = second.project.meltano("run", "--state-id-suffix", "nightly", *EL)
        assert busy.returncode == BUSY, busy.stderr
        assert f"state ID {suffixed} is busy" in busy.stderr
        assert second.tap_starts() == []
        other = second.project.meltano("run", *EL)
        assert other.returncode == 0, other.stderr
    finally:
        first.go.touch()
        assert running.wait(timeout=300) == 0, first.log.read_text()
    second.reset()
    el = second.spawn("el", *EL, "--state-id", "custom", "--force")
    assert el.wait(timeout=300) == 0, second.log.read_text()
    assert second.syncs() == 1
    store = file_backend.open()
    try:
        snapshot = history.list_snapshots(store, "custom")[-1]
    finally:
        store.close()
    assert snapshot.command.startswith("meltano el tap-sample target-jsonl --state-id custom")


# -- a killed Meltano --------------------------------------------------------------------------


def test_a_meltano_killed_with_sigkill_leaves_a_lease_that_expires_after_its_ttl(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    """The run's lease is renewed by Meltano's own process: killed (with its plugins) by
    SIGKILL, nobody renews it; the next run is refused until the TTL has passed, then runs
    from the killed run's state."""
    first, second = machines(tmp_path, meltano_addon, file_backend)
    running = first.spawn("run", *EL, GATE, new_session=True)
    try:
        wait_until(first.started.exists, "the first run never reached its gate", 300)
        taken = held_by(file_backend, running.pid)
        wait_until(
            lambda: (lease_of(file_backend) or taken).renewed_at > taken.renewed_at,
            "Meltano never renewed its lease",
            120,
        )
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        running.wait(timeout=60)
    left: Any = lease_of(file_backend)
    assert left is not None
    assert left.held
    assert left.pid == running.pid
    busy = second.project.meltano("run", *EL)
    assert busy.returncode == BUSY, busy.stderr
    refused_line(busy.stderr, running.pid)
    data = tmp_path / "events.jsonl"
    add_rows(data, 3)
    wait_until(lambda: free(file_backend), "the killed run's lease never expired", 180)
    after = second.project.meltano("run", *EL)
    assert after.returncode == 0, after.stderr
    assert delivered(second.project.output) == [11, 12, 13]  # resumed from the killed run's state


def test_a_second_run_waits_for_the_lease_when_lock_wait_seconds_is_set(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    """With ``state_backend.lock_wait_seconds`` set, the second run waits, its tap not
    started, and runs once the first has exited, from the first run's state."""
    first, second = machines(tmp_path, meltano_addon, file_backend)
    second.project.env["MELTANO_STATE_BACKEND_LOCK_WAIT_SECONDS"] = "600"
    running = first.spawn("run", *EL, GATE)
    waiting: meltano_fork.Process | None = None
    try:
        wait_until(first.started.exists, "the first run never reached its gate", 300)
        add_rows(tmp_path / "events.jsonl", 2)
        waiting = second.spawn("run", *EL)
        wait_until(
            lambda: "is busy, waiting up to 600s" in second.log.read_text(),
            "the second run never said it waits",
            300,
        )
        assert waiting.poll() is None
        assert second.tap_starts() == []
    finally:
        first.go.touch()
        assert running.wait(timeout=300) == 0, first.log.read_text()
    assert waiting.wait(timeout=300) == 0, second.log.read_text()
    assert second.syncs() == 1
    assert delivered(second.project.output) == [11, 12]


def test_meltano_run_inside_exec_runs_under_the_exec_lease(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    """Under ``mapper-state exec`` on the pipeline's state ID, ``meltano run`` takes no second
    lease: it runs, and its state is written under exec's run ID."""
    (only,) = machines(tmp_path, meltano_addon, file_backend, count=1)
    wrapped = subprocess.run(
        [
            str(tools.mapper_state()),
            "exec",
            "--state-id",
            STATE_ID,
            "--state-backend-uri",
            file_backend.uri,
            "--",
            str(meltano_addon),
            "run",
            *EL,
        ],
        cwd=only.project.cwd,
        env=only.project.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert wrapped.returncode == 0, wrapped.stderr
    assert "is busy" not in wrapped.stderr
    assert "holding the lease" not in wrapped.stderr  # it holds none: exec does
    assert f"running under the lease on {STATE_ID} in {file_backend.uri}" in wrapped.stderr
    assert "(mapper-state exec)" in wrapped.stderr
    assert delivered(only.project.output) == list(range(1, 11))
    store = file_backend.open()
    try:
        snapshots = history.list_snapshots(store, STATE_ID)
    finally:
        store.close()
    assert len({s.run_id for s in snapshots}) == 1
    assert snapshots[-1].command.startswith("meltano run tap-sample target-jsonl")


def test_a_broken_lease_stops_the_run(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    """``mapper-state lock break`` on a running pipeline: the heartbeat of the Meltano process
    finds its lease gone and stops the step it is running; Meltano fails the run."""
    (only,) = machines(tmp_path, meltano_addon, file_backend, count=1)
    running = only.spawn("run", *EL, GATE)
    try:
        wait_until(only.started.exists, "the run never reached its gate", 300)
        gate = only.gate_pid()
        args = ["lock", "break", STATE_ID, "--yes", "--state-backend-uri", file_backend.uri]
        broken = subprocess.run(
            [str(tools.mapper_state()), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert broken.returncode == 0, broken.stderr
        code = running.wait(timeout=300)  # the gate is never opened: only the loss ends it
    finally:
        only.go.touch()
        running.wait(timeout=300)
    log = only.log.read_text()
    assert code == 4, log  # lease lost, as for run, exec and the filter
    assert f"lost the lease on {STATE_ID}" in log, log
    assert "stopping this run (" in log, log
    assert not pid_alive(gate), log


#: A tap wrapper that relays tap-sample's messages slowly: each RECORD after the tenth a tenth
#: of a second late, its STATE at once behind it (tap-sample emits one after each record
#: here); after the tenth it writes its pid to ``$1``. A break lands between two records.
#: The extractor of the broken run: tap-sample through a relay that slows it down after 10
#: records, and writes each record together with the state that follows it, in one write
#: (atomic on a pipe), so that however it is stopped its output never ends between a record
#: and its state. target-jsonl forgets its state at every record and confirms only the
#: last one, at its end: cut there, it would confirm nothing, and the next run would load
#: every row again, as after any run whose loader confirmed no state (it did, once in CI).
SLOW_TAP = """\
import subprocess, sys, time
marker, tap = sys.argv[1], sys.argv[2:]
child = subprocess.Popen(tap, stdout=subprocess.PIPE)
records, pending = 0, b""
for line in child.stdout:
    if b'"RECORD"' in line:
        records += 1
        if records > 10:
            time.sleep(0.1)
        pending += line
        continue
    sys.stdout.buffer.write(pending + line)
    sys.stdout.flush()
    pending = b""
    if records == 10 and b'"STATE"' in line:
        open(marker, "w").write(str(child.pid))
sys.stdout.buffer.write(pending)
sys.stdout.flush()
sys.exit(child.wait())
"""


def test_a_break_in_the_el_block_loads_no_row_twice(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    """``lock break`` while the tap is extracting, a second machine's run waiting for the
    lease: the broken run stops its tap, its target loads what it was sent and confirms it,
    that state is kept, and the next run takes the lease once the broken one has stopped
    (well within the TTL) and resumes from it: every row is loaded exactly once (the tap's
    output ends on a state however it is stopped: ``SLOW_TAP``)."""
    rows = 60
    first, second = machines(tmp_path, meltano_addon, file_backend)
    add_rows(tmp_path / "events.jsonl", rows - 10)
    for each in (first, second):
        doc = yaml.safe_load((each.project.root / "meltano.yml").read_text())
        doc["plugins"]["extractors"][0]["config"]["state_message_frequency"] = 1
        (each.project.root / "meltano.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    relay, marker = tmp_path / "slow_tap.py", tmp_path / "mid-el"
    relay.write_text(SLOW_TAP)
    wrapper = first.project.root / "tap-sample"  # the recording wrapper, through the relay
    wrapper.write_text(
        wrapper.read_text().replace(
            "exec ", f"exec {tools.project_bin('python')} {relay} {marker} ", 1
        )
    )
    second.project.env["MELTANO_STATE_BACKEND_LOCK_WAIT_SECONDS"] = "120"
    running = first.spawn("run", *EL)
    waiting: meltano_fork.Process | None = None
    try:
        wait_until(marker.exists, "the first run's tap never got going", 300)
        ttl = held_by(file_backend, running.pid).ttl_seconds
        args = ["lock", "break", STATE_ID, "--yes", "--state-backend-uri", file_backend.uri]
        broken = subprocess.run(
            [str(tools.mapper_state()), *args], capture_output=True, text=True, timeout=120
        )
        assert broken.returncode == 0, broken.stderr
        broke = time.time()
        waiting = second.spawn("run", *EL)
        code = running.wait(timeout=300)
        assert waiting.wait(timeout=300) == 0, second.log.read_text()
    finally:
        for proc in (running, waiting):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
    log = first.log.read_text()
    assert code == 4, log  # lease lost
    loaded_first, loaded_second = delivered(first.project.output), delivered(second.project.output)
    assert loaded_first, log
    assert len(loaded_first) < rows, "the broken run was not stopped before it ended"
    assert sorted(loaded_first + loaded_second) == list(range(1, rows + 1)), (
        f"first loaded {loaded_first}, second {loaded_second}\n{log}"
    )
    starts = second.taps.stat().st_mtime  # the second run's first tap start
    assert starts - broke < ttl, f"the next run started {starts - broke:.1f}s after the break"
    print(
        f"lock break mid-EL: first loaded {len(loaded_first)} rows, the next started "
        f"{starts - broke:.1f}s after the break and loaded {len(loaded_second)}"
    )


# -- no step outlives the lease ------------------------------------------------------------


def test_sigterm_during_a_step_after_the_el_block_stops_it_and_frees_the_lease(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    """SIGTERM to ``meltano run`` in its utility step (standing for dbt): the step is
    stopped and the lease released at once, not left to its TTL; exit 143."""
    (only,) = machines(tmp_path, meltano_addon, file_backend, count=1)
    running = only.spawn("run", *EL, GATE)
    try:
        wait_until(only.started.exists, "the run never reached its gate", 300)
        gate = only.gate_pid()
        held_by(file_backend, running.pid)
        running.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        wait_until(lambda: free(file_backend), "the lease was not freed", 30)
        freed = time.monotonic() - sent
        code = running.wait(timeout=60)
    finally:
        only.go.touch()
        running.wait(timeout=300)
    log = only.log.read_text()
    assert code == 128 + signal.SIGTERM, log
    assert not pid_alive(gate), log
    assert freed < 5, log  # within 2 s on a quiet machine
    print(f"meltano run, SIGTERM in a utility step: lease free after {freed:.2f} s")


def test_a_meltano_killed_in_a_step_leaves_no_process_of_the_run_once_its_lease_expired(
    tmp_path: Path,
    meltano_addon: Path,  # noqa: F811
    file_backend: Backend,  # noqa: F811
) -> None:
    """SIGKILL of Meltano alone (not its process group) in its utility step: nobody renews
    the lease, and the step does not run on unguarded: it is gone by the lease's expiry."""
    (only,) = machines(tmp_path, meltano_addon, file_backend, count=1)
    running = only.spawn("run", *EL, GATE)
    try:
        wait_until(only.started.exists, "the run never reached its gate", 300)
        gate = only.gate_pid()
        held_by(file_backend, running.pid)
        running.send_signal(signal.SIGKILL)
        running.wait(timeout=60)
        left = lease_of(file_backend)
        assert left is not None
        wait_until(lambda: not pid_alive(gate), "the step outlived the killed Meltano", 60)
        assert time.time() < left.expires_at + 2, "the step ran on past the lease's expiry"
    finally:
        only.go.touch()
