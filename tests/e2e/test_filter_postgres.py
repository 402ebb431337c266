"""The filter in a shell pipeline: ``tap --state FIFO | mapper-state --state-file FIFO | target``.

Run by bash with ``set -o pipefail``, with the real tap-postgres and target-jsonl. A
``tee`` between mapper-state and the target records the stream the target received,
which is byte for byte what the tap emitted: with ``--state``, tap-postgres's first
message is a STATE echoing the state it was given, so the recording shows what the
tap received through the named pipe.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e.conftest import (
    Mapper,
    Source,
    Store,
    Target,
    kill_if_running,
    wait_for,
)

# Run in the test's directory: the outputs are named relative to it.
PIPELINE = """\
set -o pipefail
trap 'echo "${{PIPESTATUS[*]}}" > {run}.pipestatus' EXIT
{tap} --config {tap_config} --catalog {catalog} --state {fifo} 2> {run}.tap.err \\
  | {mapper} --state-id {state_id} --state-file {fifo} 2> {run}.mapper.err \\
  | tee {run}.stream \\
  | {target} > {run}.target.out 2> {run}.target.err
"""
# The filter after the target: it commits the bare states the target prints.
PIPELINE_AFTER_TARGET = """\
set -o pipefail
trap 'echo "${{PIPESTATUS[*]}}" > {run}.pipestatus' EXIT
{tap} --config {tap_config} --catalog {catalog} --state {fifo} 2> {run}.tap.err \\
  | {target} 2> {run}.target.err \\
  | {mapper} --after-target --state-id {state_id} --state-file {fifo} \\
      > {run}.mapper.out 2> {run}.mapper.err
"""


@dataclass
class ShellPipeline:
    """One shell pipeline per run, with a fresh named pipe for the state hand-off."""

    source: Source
    target: Target
    mapper: Mapper
    state_id: str
    tmp: Path
    template: str = PIPELINE

    def script(self, run: str) -> str:
        fifo = self.tmp / f"{run}.state.fifo"
        os.mkfifo(fifo, 0o600)
        q = shlex.quote
        return self.template.format(
            run=run,
            tap=q(str(self.source.tap)),
            tap_config=q(str(self.source.tap_config)),
            catalog=q(str(self.source.catalog)),
            fifo=q(str(fifo)),
            mapper=q(str(self.mapper.executable)),
            state_id=q(self.state_id),
            target=self.target.command(run),
        )

    def start(self, run: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["bash", "-c", self.script(run)],
            cwd=self.tmp,
            env=self.mapper.env(),
            stdin=subprocess.DEVNULL,
        )

    def run(self, run: str, timeout: float = 120) -> int:
        proc = self.start(run)
        try:
            return proc.wait(timeout=timeout)
        finally:
            kill_if_running(proc)

    def pipestatus(self, run: str) -> list[int]:
        return [int(code) for code in (self.tmp / f"{run}.pipestatus").read_text().split()]

    def stream(self, run: str) -> list[dict[str, Any]]:
        """The messages that went from mapper-state (that is, from the tap) to the target."""
        return [json.loads(line) for line in (self.tmp / f"{run}.stream").read_text().splitlines()]

    def log(self, run: str, who: str) -> str:
        return (self.tmp / f"{run}.{who}.err").read_text()


def test_shell_pipeline_hands_the_tap_the_locked_prior_state(
    source: Source, jsonl: Target, store: Store, mapper: Mapper, state_id: str, tmp_path: Path
) -> None:
    shell = ShellPipeline(source, jsonl, mapper, state_id, tmp_path)
    source.insert(1, 5)

    # first run: no prior state, mapper-state hands the tap {} and the tap syncs everything
    status = shell.run("first")
    assert status == 0, f"{shell.pipestatus('first')}\n{shell.log('first', 'mapper')}"
    assert shell.pipestatus("first") == [0, 0, 0, 0]
    assert sorted(jsonl.delivered("first", source.stream)) == [1, 2, 3, 4, 5]
    assert mapper.state_get(state_id) == source.state(5)
    assert store.lease(state_id) is None  # released

    # second run: while it runs, the lease is held by the mapper-state of this pipeline
    source.insert(6, 8)
    proc = shell.start("second")
    holders: list[dict[str, Any]] = []

    def lease_seen() -> bool:
        holder = store.lease(state_id)
        if holder:
            holders.append(holder)
        return bool(holders) or proc.poll() is not None

    try:
        wait_for(lease_seen, 60, "the pipeline's mapper-state to take the lease", interval=0.01)
        status = proc.wait(timeout=120)
    finally:
        kill_if_running(proc)
    assert status == 0, f"{shell.pipestatus('second')}\n{shell.log('second', 'mapper')}"
    assert holders, "the pipeline ran without the lease ever being seen in the store"
    assert f"--state-id {state_id} --state-file" in holders[0]["command"]

    # the tap received the stored state through the FIFO: its first message echoes it,
    # and it sent only rows from the bookmark on (>=: row 5, the bookmark row, again)
    messages = shell.stream("second")
    assert messages[0] == {"type": "STATE", "value": source.state(5)}, messages[0]
    records = [m["record"]["id"] for m in messages if m["type"] == "RECORD"]
    assert records == [5, 6, 7, 8]
    assert jsonl.delivered("second", source.stream) == [5, 6, 7, 8]
    assert (
        f"bookmark value: {source.state(5)['bookmarks'][source.stream]['replication_key_value']}"
        in (shell.log("second", "tap"))
    )
    # the filter committed the tap's last state; the lease is released
    assert messages[-1] == {"type": "STATE", "value": source.state(8)}
    assert mapper.state_get(state_id) == source.state(8)
    assert store.document(state_id) == {
        "completed": {"singer_state": source.state(8)},
        "partial": {},
    }
    assert store.lease(state_id) is None


def test_shell_pipeline_with_a_busy_lease_fails_fast_without_touching_the_state(
    source: Source, jsonl: Target, store: Store, mapper: Mapper, state_id: str, tmp_path: Path
) -> None:
    """Another run holds the lease: mapper-state opens and closes the FIFO empty, so the tap
    fails on an empty state instead of hanging, nothing reaches the target, the state is left
    alone and ``pipefail`` makes the pipeline's status mapper-state's exit code 3."""
    source.insert(1, 5)
    set_state = mapper("state", "set", state_id, json.dumps(source.state(3)))
    assert set_state.returncode == 0, set_state.stderr

    holder = subprocess.Popen(
        [str(mapper.executable), "--state-id", state_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=mapper.env(),
        cwd=tmp_path,
    )
    try:
        wait_for(
            lambda: mapper.lock_status(state_id)["free"] is False or holder.poll() is not None,
            30,
            "the holder to take the lease",
            interval=0.1,
        )
        assert holder.poll() is None, holder.stderr.read() if holder.stderr else ""
        shell = ShellPipeline(source, jsonl, mapper, state_id, tmp_path)
        status = shell.run("busy", timeout=60)  # a hang would time out here
        assert mapper.lock_status(state_id)["holder"]["pid"] == holder.pid  # not broken
    finally:
        if holder.stdin:
            holder.stdin.close()
        holder.wait(timeout=30)
        kill_if_running(holder)

    tap, filt, _tee, _target = shell.pipestatus("busy")
    assert (tap, filt) == (1, 3), shell.pipestatus("busy")
    assert status == 3  # pipefail: the rightmost failure is mapper-state's
    err = shell.log("busy", "mapper")
    assert f"state ID {state_id} is busy: held by run " in err
    assert f"(pid {holder.pid})" in err
    assert "Expecting value" in shell.log("busy", "tap")  # it read an empty state
    assert jsonl.delivered("busy", source.stream) == []
    assert mapper.state_get(state_id) == source.state(3)
    assert holder.returncode == 0


def test_shell_pipeline_with_the_filter_after_the_target(
    source: Source, jsonl: Target, store: Store, mapper: Mapper, state_id: str, tmp_path: Path
) -> None:
    """``tap --state FIFO | target | mapper-state --after-target --state-file FIFO``: the state
    stored is the one the target printed once it had written the rows, and the tap at the
    head of the pipeline still gets it through the named pipe on the next run."""
    shell = ShellPipeline(source, jsonl, mapper, state_id, tmp_path, PIPELINE_AFTER_TARGET)
    source.insert(1, 5)
    assert shell.run("first") == 0, shell.log("first", "mapper")
    assert shell.pipestatus("first") == [0, 0, 0]
    confirmed = (tmp_path / "first.mapper.out").read_text().splitlines()
    assert [json.loads(line) for line in confirmed] == [source.state(5)]  # passed through
    assert mapper.state_get(state_id) == source.state(5)

    source.insert(6, 8)
    assert shell.run("second") == 0, shell.log("second", "mapper")
    assert jsonl.delivered("second", source.stream) == [5, 6, 7, 8]  # >=: row 5 again
    assert mapper.state_get(state_id) == source.state(8)
    assert store.lease(state_id) is None
