"""``python -m tests.simulation``: run schedules, replay one, or run the long budget.

    python -m tests.simulation --seed S          replay one schedule, print its trace
    python -m tests.simulation --seed S --shrink a failing one shrunk to its smallest world
    python -m tests.simulation --seed S --variant NAME   under a broken variant
    python -m tests.simulation --seeds N         run seeds 0..N-1 (from --start)
    python -m tests.simulation --seconds T       run fresh seeds for T seconds (the long run)
    python -m tests.simulation --variants        each broken variant, over its stated seeds

Exits 1 when an invariant breaks (or a variant is not caught), printing the failing seed,
its plan and its trace; ``make simulate`` is the front door.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time

from tests.simulation.run import Budget, simulate
from tests.simulation.shrink import report as shrunk_report
from tests.simulation.shrink import shrink
from tests.simulation.variants import FOUND_AT_SEED, VARIANTS


def _figures(budget: Budget, label: str) -> str:
    rate = budget.schedules / budget.seconds if budget.seconds else 0.0
    lines = [
        f"{label}: {budget.schedules} schedules in {budget.seconds:.1f} s of CPU "
        f"({rate:.1f} per second), {budget.steps} scheduling steps, {budget.checks} "
        f"invariant checks, {len(budget.failures)} failing",
        "faults injected, by class (schedules with it, or calls for the network's):",
    ]
    for name, count in sorted(budget.faults.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:<40} {count}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation")
    parser.add_argument("--seed", type=int, help="replay one schedule and print its trace")
    parser.add_argument("--seeds", type=int, help="run this many seeds")
    parser.add_argument("--start", type=int, default=0, help="the first seed of --seeds")
    parser.add_argument("--seconds", type=float, help="run fresh seeds for this long (CPU)")
    parser.add_argument("--variants", action="store_true", help="check the broken variants")
    parser.add_argument(
        "--shrink", action="store_true", help="with --seed: shrink a failing schedule"
    )
    parser.add_argument(
        "--variant",
        choices=[v.name for v in VARIANTS],
        help="with --seed: run it under this broken variant of the protocol",
    )
    args = parser.parse_args(argv)
    if args.seed is not None:
        variant = next((v for v in VARIANTS if v.name == args.variant), None)
        if args.shrink:
            try:
                first, best = shrink(args.seed, variant=variant)
            except ValueError as exc:
                print(exc)
                return 0
            print(shrunk_report(first, best))
            return 1
        result = simulate(args.seed, variant=variant)
        print(result.report(tail=10**6) if not result.ok else "\n".join(result.trace))
        print(f"seed {args.seed}: {'ok' if result.ok else 'FAILED'}, {result.checks} checks")
        return 0 if result.ok else 1
    if args.variants:
        missed = 0
        for variant in VARIANTS:
            caught = next(
                (s for s in range(variant.seeds) if not simulate(s, variant=variant).ok), None
            )
            missed += caught is None
            said = f"caught by seed {caught}" if caught is not None else "NOT CAUGHT"
            print(f"{variant.name}: {said} (stated: within {variant.seeds} seeds): {variant.what}")
            if caught is not None:
                print(f"  its trace: make simulate SEED={caught} VARIANT={variant.name} [SHRINK=1]")
        for variant, seed in FOUND_AT_SEED:
            caught = not simulate(seed, variant=variant).ok
            missed += not caught
            said = "caught" if caught else "NOT CAUGHT"
            print(f"{variant.name}: {said} at its seed {seed}: {variant.what}")
        return 1 if missed else 0
    budget = Budget()
    started = time.process_time()
    if args.seconds is not None:
        base = random.SystemRandom().randrange(10**9)
        print(f"fresh seeds from {base}", flush=True)
        seeds: itertools.count[int] | range = itertools.count(base)
    else:
        seeds = range(args.start, args.start + (args.seeds or 1000))
    for seed in seeds:
        result = simulate(seed)
        budget.add(result)
        if not result.ok:
            print(result.report())
            print(f"shrink it: make simulate SEED={seed} SHRINK=1")
            break
        if args.seconds is not None and time.process_time() - started > args.seconds:
            break
    budget.seconds = time.process_time() - started
    print(_figures(budget, "simulation"))
    return 1 if budget.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
