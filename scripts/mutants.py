#!/usr/bin/env python3
"""Break the code on purpose, one safety line at a time, and see whether a test notices.

Each mutant names a file, an exact snippet of it, its replacement and the tests that must
catch it. The study copies the checkout into a scratch directory with a virtualenv of its
own (so that every process a test starts runs the mutated code), applies one mutant,
runs its tests against their real servers, restores the file, and records whether a test
failed (caught) or none did (survived). A snippet that is not found exactly once stops
the study before anything runs: the code moved, so the mutant must be re-targeted.

    .venv/bin/python scripts/mutants.py                # every mutant (make mutants)
    .venv/bin/python scripts/mutants.py --list         # check every snippet, run nothing
    .venv/bin/python scripts/mutants.py -k redaction   # the mutants whose name holds it

It prints the table of ``docs/reliability.md`` (name, caught or survived, the seconds
its tests took) and exits 1 if a mutant survived. It is not part of ``make test``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.dist import checkout_files  # noqa: E402


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    original: str
    replacement: str
    tests: tuple[str, ...]


#: Where the study's own tests live (short node lists keep the study to minutes).
FENCING = "tests/test_write_fencing.py"
SECRETS = "tests/chaos/test_secrets.py"
ADDON = "tests/e2e/test_meltano_backend.py"

SIMULATION = "tests/simulation/test_simulation.py::test_a_budget_of_schedules_breaks_no_invariant"

MUTANTS = (
    Mutant(
        "commit (filter, run, state set/merge/edit, add-on set): no lease confirmation before the write",
        "mapper_state/core/commit.py",
        "    with _within(lease.confirm()):\n        written = _swap(",
        "    with _within(None):\n        written = _swap(",
        (
            f"{FENCING}::test_a_commit_under_a_broken_lease_writes_nothing",
            "tests/chaos/test_session_fencing.py::test_a_broken_holder_stores_nothing_and_exits_4[file]",
        ),
    ),
    Mutant(
        "state clear (commit.remove): no lease confirmation before the delete",
        "mapper_state/core/commit.py",
        "        with _within(lease.confirm()):\n            delete_held(",
        "        with _within(None):\n            delete_held(",
        (
            f"{FENCING}::test_a_clear_under_a_broken_lease_deletes_nothing",
            f"{ADDON}::test_a_runs_write_after_its_lease_was_broken_is_refused[delete]",
        ),
    ),
    Mutant(
        "a writer inside exec: the enclosing run's lease not confirmed (InheritedLease.confirm)",
        "mapper_state/core/inherited.py",
        "        holder, _ = read_lease(self.store, self.state_id)\n        now = self.clock()\n",
        "        return 1e9\n        holder, _ = read_lease(self.store, self.state_id)\n        now = self.clock()\n",
        (f"{FENCING}::test_a_write_inside_exec_after_its_lease_was_broken_writes_nothing",),
    ),
    Mutant(
        "Meltano add-on in a run: the run's lease not confirmed (RunLease.confirm)",
        "mapper_state/meltano/backend.py",
        "        if not is_held_by(holder, self.owner, time.time()):\n            raise LeaseLost(",
        "        if False:\n            raise LeaseLost(",
        (f"{ADDON}::test_a_runs_write_after_its_lease_was_broken_is_refused[set]",),
    ),
    Mutant(
        "Meltano add-on set: the write not conditional on the version read (no compare-and-swap)",
        "mapper_state/meltano/backend.py",
        "        outcome = commit.commit(self.store, lease, prior, value, options, document=document)",
        "        prior = __import__('dataclasses').replace(\n"
        "            prior, version=state.load(self.store, state_id).version\n"
        "        )\n"
        "        outcome = commit.commit(self.store, lease, prior, value, options, document=document)",
        (
            "tests/e2e/test_meltano_backend.py::"
            "test_a_state_changed_behind_the_lease_is_not_overwritten_by_the_add_on",
        ),
    ),
    Mutant(
        "Meltano add-on acquire_lock: no lease taken",
        "mapper_state/meltano/backend.py",
        "            holder = lease.try_acquire()\n            if holder is not None and is_this_run(holder):",
        "            holder = None\n            if holder is not None and is_this_run(holder):",
        (
            "tests/e2e/test_meltano_backend.py::test_state_set_waits_for_a_filter_holding_the_lease_then_names_it",
        ),
    ),
    Mutant(
        "run: a target's echoed Singer STATE message stored wrapped",
        "mapper_state/stream/pump.py",
        '            value = value["value"]  # a target that echoes Singer STATE messages: their value',
        "            pass",
        ("tests/test_run.py::test_a_target_that_echoes_state_messages_has_their_value_stored",),
    ),
    Mutant(
        "A-B-A: a store whose version restarts at 1 when a key is created again",
        "mapper_state/stores/memory.py",
        '                raise PreconditionFailed(f"{key} already exists")\n            version = self._new_version()',
        '                raise PreconditionFailed(f"{key} already exists")\n            version = "1"',
        (
            "tests/stores/test_memory_store.py::TestMemoryStore::test_a_version_never_repeats_after_a_delete",
        ),
    ),
    Mutant(
        "_prove_exclusive returns at once",
        "mapper_state/core/lease/protocol.py",
        "    if not store.traits.proves_create_condition:\n        return claim",
        "    return claim",
        ("tests/chaos/test_unsafe_stores.py::test_on_s3rver_every_racer_refuses_and_names_doctor",),
    ),
    Mutant(
        "a create or takeover whose answer was lost: the lease that landed is not adopted",
        "mapper_state/core/lease/protocol.py",
        "    if blob is None or found is None or not is_held_by(found, me.owner):\n        raise exc\n    log.info(",
        "    raise exc\n    log.info(",
        (
            "tests/chaos/test_unknown_outcomes.py::test_a_create_and_a_renewal_whose_answers_are_lost_leave_the_run_the_holder[s3]",
        ),
    ),
    Mutant(
        "the heartbeat swallows a lost lease (on_lost never called)",
        "mapper_state/core/lease/driver.py",
        "        if on_lost:\n            on_lost(self.lost)",
        "        pass",
        (
            "tests/test_lease_cli.py::test_a_broken_lease_stops_an_idle_run_without_waiting_for_input",
        ),
    ),
    Mutant(
        "_release_if_ours releases without checking the record is ours",
        "mapper_state/core/lease/protocol.py",
        "            if not is_held_by(found, claim.owner):\n                return",
        "            if False:\n                return",
        (f"{FENCING}::test_a_holder_that_lost_its_lease_leaves_the_new_holders_alone",),
    ),
    Mutant(
        "the store deadline is not lowered to a third of the lease TTL",
        "mapper_state/stores/__init__.py",
        "retry_deadline_seconds=settings.lock_timeout / 3,",
        "retry_deadline_seconds=None,",
        (
            "tests/chaos/test_wire_faults.py::test_a_hung_state_write_under_a_lease_is_cut_at_a_third_of_the_ttl",
        ),
    ),
    Mutant(
        "the pump loses a partial line between two reads",
        "mapper_state/stream/pump.py",
        "        if first_nl < 0:\n            self._extend_carry(chunk[:end])\n            return",
        "        if first_nl < 0:\n            return",
        ("tests/test_passthrough.py",),
    ),
    Mutant(
        "the empty-state guard is off",
        "mapper_state/core/bookmarks.py",
        "    if allow_reset or full_refresh or not holds_bookmarks(stored):",
        "    if True:",
        ("tests/test_guard.py",),
    ),
    Mutant(
        "the unknown-variable warning is silent",
        "mapper_state/settings/loading.py",
        "    warnings = unknown_variables(specs, env, other_variables, sources)",
        "    warnings: list[str] = []",
        ("tests/test_cli_messages.py::test_a_misspelt_variable_gets_the_closest_setting",),
    ),
    Mutant(
        "redaction hides only the first 20 characters of an Azure key",
        "mapper_state/redact.py",
        "            text = text.replace(secret, MASK)",
        '            text = text.replace(secret[:20] if "AccountKey" in secret else secret, MASK)',
        (f"{SECRETS}::test_azure_connection_string_never_leaks",),
    ),
    Mutant(
        "redaction hides only the first 20 characters of a GCS service-account key",
        "mapper_state/redact.py",
        "            text = text.replace(secret, MASK)",
        '            text = text.replace(secret[:20] if "private_key" in secret else secret, MASK)',
        (f"{SECRETS}::test_gcs_credentials_json_never_leaks",),
    ),
    Mutant(
        "redaction hides only the first 20 characters of a password in a URI",
        "mapper_state/redact.py",
        "        if password:\n            found.append(password)",
        "        if password:\n            found.append(password[:20])",
        (
            f"{SECRETS}::test_a_password_in_a_uri_never_leaks",
            f"{SECRETS}::test_a_long_postgres_password_never_leaks",
        ),
    ),
    Mutant(
        "redaction hides only the first 20 characters of a PostgreSQL password (libpq's password parameter)",
        "mapper_state/redact.py",
        '    found = [m.group("value") for m in _QUERY_SECRET.finditer(uri or "") if m.group("value")]',
        '    found = [m.group("value")[:20] for m in _QUERY_SECRET.finditer(uri or "") if m.group("value")]',
        (f"{SECRETS}::test_a_long_postgres_password_never_leaks",),
    ),
    # what the deterministic simulation catches and the other tests do not
    Mutant(
        "the skew allowance is 0 (clocks taken to agree)",
        "mapper_state/core/lease/record.py",
        "    return min(2.0, ttl / 5)",
        "    return 0.0",
        (SIMULATION,),
    ),
    Mutant(
        "release trusts a conditional delete on a store that ignores delete conditions",
        "mapper_state/core/lease/record.py",
        "    return traits.enforces_delete_conditions and not traits.learned.refuses_delete_conditions.known",
        "    return True",
        (SIMULATION,),
    ),
    Mutant(
        "a renewal refused over an earlier renewal of ours that landed unseen calls the lease lost",
        "mapper_state/core/lease/protocol.py",
        "        if holder.acquired_at == claim.record.acquired_at:",
        "        if False:",
        (SIMULATION,),
    ),
)


def check(mutants: tuple[Mutant, ...], root: Path) -> list[str]:
    """Every mutant whose snippet is not found exactly once, with the count."""
    problems = []
    for m in mutants:
        path = root / m.path
        count = path.read_text().count(m.original) if path.exists() else 0
        if count != 1:
            problems.append(f"{m.name}: snippet found {count} times in {m.path}")
    return problems


def scratch_copy() -> Path:
    """The checkout's files in a temporary directory, with a virtualenv of their own."""
    scratch = Path(tempfile.mkdtemp(prefix="mapper-state-mutants-"))
    for rel in checkout_files():
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, scratch / rel)
    if (ROOT / ".tools").exists():
        (scratch / ".tools").symlink_to((ROOT / ".tools").resolve())
    subprocess.run(["make", "setup"], cwd=scratch, check=True, capture_output=True)
    return scratch


def run(m: Mutant, scratch: Path) -> tuple[str | None, float]:
    """Apply ``m`` in ``scratch``, run its tests, restore: (the test that caught it, or
    ``None``; seconds)."""
    target = scratch / m.path
    original = target.read_text()
    target.write_text(original.replace(m.original, m.replacement, 1))
    started = time.monotonic()
    try:
        result = subprocess.run(
            [str(scratch / ".venv/bin/pytest"), "-q", "-x", "-p", "no:cacheprovider", *m.tests],
            cwd=scratch,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        target.write_text(original)
    if result.returncode not in (0, 1):  # 2..5: interrupted, usage, no tests: not a verdict
        raise SystemExit(f"{m.name}: pytest exited {result.returncode}\n{result.stdout[-3000:]}")
    seconds = time.monotonic() - started
    if result.returncode == 0:
        return None, seconds
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, re.M)
    return (failed[0] if failed else "?"), seconds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only the mutants whose name holds this")
    parser.add_argument("--list", action="store_true", help="check the snippets, run nothing")
    args = parser.parse_args(argv)
    chosen = tuple(m for m in MUTANTS if args.k.lower() in m.name.lower())
    problems = check(MUTANTS, ROOT)
    if problems:
        print("the code moved: re-target these mutants first\n  " + "\n  ".join(problems))
        return 2
    if args.list:
        for m in chosen:
            print(f"{m.name}\n    {m.path}; {' '.join(m.tests)}")
        return 0
    scratch = scratch_copy()
    try:
        print("| mutant | verdict | seconds | caught by |\n|---|---|---|---|", flush=True)
        survived = 0
        for m in chosen:
            caught, seconds = run(m, scratch)
            survived += caught is None
            verdict = "caught" if caught else "**survived**"
            by = f"`{caught}`" if caught else "(ran " + ", ".join(f"`{t}`" for t in m.tests) + ")"
            print(f"| {m.name} | {verdict} | {seconds:.0f} | {by} |", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
