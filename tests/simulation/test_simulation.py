"""The deterministic simulation of the lease, in every test run.

A budget of schedules (fixed seeds, plus a block of fresh ones each run, whose seed a
failure prints for ``make simulate SEED=S``), each broken variant caught within its stated
number of seeds on worlds that the real code passes, and a seed that replays exactly.
``make simulate`` runs the long budget.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simulation.run import simulate
from tests.simulation.shrink import report as shrunk_report
from tests.simulation.shrink import shrink
from tests.simulation.variants import FOUND_AT_SEED, VARIANTS, Variant

#: Seeds per test (a block: the blocks run side by side on the suite's workers).
BLOCK = 250
FIXED_BLOCKS = 6
#: A block of fresh seeds each run, from a base printed with any failure.
FRESH_BASE = int(os.environ.get("MAPPER_STATE_SIM_BASE") or random.SystemRandom().randrange(10**9))


def _run_block(first: int) -> None:
    for seed in range(first, first + BLOCK):
        result = simulate(seed)
        assert result.ok, result.report()


@pytest.mark.parametrize("block", range(FIXED_BLOCKS))
def test_a_budget_of_schedules_breaks_no_invariant(block: int) -> None:
    _run_block(block * BLOCK)


def test_fresh_schedules_break_no_invariant() -> None:
    print(f"fresh seeds from {FRESH_BASE} (MAPPER_STATE_SIM_BASE={FRESH_BASE} replays them)")
    _run_block(FRESH_BASE)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_each_broken_variant_is_caught_within_its_seeds(variant: Variant) -> None:
    caught = next((s for s in range(variant.seeds) if not simulate(s, variant=variant).ok), None)
    assert caught is not None, f"{variant.what}: not caught by any of seeds 0..{variant.seeds - 1}"
    # the world shaped to meet it breaks nothing on the real code: the catch is the variant's
    control = Variant(variant.name, variant.what, variant.seeds, (), variant.adjust)
    result = simulate(caught, variant=control)
    assert result.ok, result.report()


@pytest.mark.parametrize(("variant", "seed"), FOUND_AT_SEED, ids=lambda v: getattr(v, "name", v))
def test_each_rare_bug_found_is_caught_at_its_seed(variant: Variant, seed: int) -> None:
    caught = simulate(seed, variant=variant)
    assert not caught.ok, f"{variant.what}: seed {seed} no longer catches it"
    control = Variant(variant.name, variant.what, variant.seeds, (), variant.adjust)
    result = simulate(seed, variant=control)
    assert result.ok, result.report()


def test_a_forced_break_is_judged_by_the_lease_it_broke_not_by_the_one_first_seen() -> None:
    """Seed 5120: the operator starts ``lock break --force`` while the lease is free, a run
    takes it, and the break lands on that run's lease. That run was forced while it ran (it
    gives up 3 by definition): the simulator used to judge by the lease the operator saw
    when it started, and called the run's data passed on a broken invariant."""
    result = simulate(5120)
    assert result.ok, result.report()
    assert result.faults.get("lock break --force of a live holder") == 1


def test_a_state_written_under_a_lease_by_a_forced_holder_is_a_right_conclusion() -> None:
    """Seed 784522434 (a fresh seed of one CI run): ``lock break --force`` of a live exec
    whose state write was still on its way; it landed after the next run took the lease,
    and that run refused to overwrite the state changed behind it (exit 4). The simulator
    called that a false loss (invariant 5: "the store held it as its own") although another
    writer had touched the state under that lease; it now reads the state writes too."""
    result = simulate(784522434)
    assert result.ok, result.report()
    assert result.faults.get("lock break --force of a live holder") == 1


def test_a_writer_that_reads_its_lease_at_the_renewal_deadline_gives_up_by_the_rule() -> None:
    """Seed 393688119 (a scan of fresh seeds): an exec frozen for 1.84 s of its 3 s TTL
    renews its lease just before its renewal deadline while its command's write reads the
    record the renewal replaced, within the skew allowance of its expiry: the write is
    refused ("about to expire", ``LeaseLapsed``) and the run ends, exit 4. That is the
    rule, as for a renewal that gets no answer by the deadline; the simulator called it a
    false loss."""
    result = simulate(393688119)
    assert result.ok, result.report()
    assert "is about to expire; not writing" in " ".join(result.outcomes.values())


def test_a_seed_replays_exactly() -> None:
    seed = next(s for s in range(100) if simulate(s).steps > 200)  # a busy schedule
    first, again = simulate(seed), simulate(seed)
    assert first.trace == again.trace
    assert (first.steps, first.checks, first.faults) == (again.steps, again.checks, again.faults)
    assert len(first.trace) > 50
    # on any machine: another process (another pid) prints the very same trace
    replayed = subprocess.run(
        [sys.executable, "-m", "tests.simulation", "--seed", str(seed)],
        capture_output=True,
        check=True,
        cwd=Path(__file__).parents[2],
        timeout=120,
    )
    assert replayed.stdout.decode().splitlines()[:-1] == first.trace


def test_a_failing_seed_prints_its_trace_and_how_to_replay_it() -> None:
    variant = next(v for v in VARIANTS if v.name == "adopt-unread")
    result = next(r for s in range(variant.seeds) if not (r := simulate(s, variant=variant)).ok)
    report = result.report()
    assert f"seed {result.seed}: invariant" in report
    assert f"make simulate SEED={result.seed}" in report
    assert " c0: " in report or " c1: " in report  # who did what, with the clocks


def test_a_failing_schedule_shrinks_to_a_smaller_world_failing_the_same_way() -> None:
    """Shrinking keeps the broken invariant, never lengthens the trace, takes something
    out of the world, and gives the same result every time (it reads only the seed)."""
    variant = next(v for v in VARIANTS if v.name == "adopt-unread")
    seed = next(s for s in range(variant.seeds) if not simulate(s, variant=variant).ok)
    first, best = shrink(seed, variant=variant)
    assert not best.ok
    broken = re.search(r"invariant \d", str(first.failure))
    assert broken is not None
    assert broken.group(0) in str(best.failure)
    assert len(best.trace) < len(first.trace), shrunk_report(first, best)
    assert best.plan != first.plan
    again = shrink(seed, variant=variant)[1]
    assert (again.trace, again.plan) == (best.trace, best.plan)
    assert f"make simulate SEED={seed} SHRINK=1" in shrunk_report(first, best)
