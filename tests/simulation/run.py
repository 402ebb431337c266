"""Running schedules: one seed, a budget of seeds, a broken variant; and the trace of a failure.

:func:`simulate` builds the world a seed gives, runs it under the invariants' monitor and
returns what happened; a broken invariant (or a deadlock, or an error escaping a
contender) comes back as the failure, with the plan and the trace to read it by. The
same seed gives the same schedule on any machine: nothing reads the real clock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.simulation.invariants import Monitor
from tests.simulation.variants import Variant
from tests.simulation.world import Plan, World, plan


@dataclass
class Result:
    seed: int
    failure: BaseException | None
    trace: list[str]
    plan: str
    checks: int
    steps: int
    faults: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def report(self, tail: int = 80) -> str:
        lines = [
            f"seed {self.seed}: {self.failure}",
            self.plan,
            f"trace (last {min(tail, len(self.trace))} of {len(self.trace)} steps; "
            "true time, (the contender's own clock), who: what):",
            *self.trace[-tail:],
            f"replay: make simulate SEED={self.seed}",
        ]
        return "\n".join(lines)


def simulate(seed: int, *, variant: Variant | None = None, chosen: Plan | None = None) -> Result:
    """Run the schedule of ``seed`` (under ``variant``, a broken protocol, if given), in the
    world the seed gives or, when shrinking (``tests/simulation/shrink.py``), in the world
    ``chosen`` as it is given."""
    if chosen is None:
        chosen = plan(seed)
        chosen = variant.adjust(chosen) if variant else chosen
    world = World(chosen)
    monitor = Monitor(world)
    world.store.on_landed = monitor.landed
    world.on_passed = monitor.passed
    failure: BaseException | None = None
    with variant.applied() if variant else contextlib.nullcontext():
        try:
            world.run()
            monitor.end()
        except (AssertionError, Exception) as exc:  # noqa: BLE001 - the failure is the result
            failure = exc
    return Result(
        seed,
        failure,
        world.sim.trace,
        world.plan.describe(),
        monitor.checks,
        world.sim.steps,
        _fault_classes(world),
        dict(world.events.outcome),
    )


def _fault_classes(world: World) -> dict[str, int]:
    """What one schedule injected, by fault class: the network's faults as the store counted
    them, and the world's (pauses, kills, breaks, the kind of store, clocks at the edge)."""
    from mapper_state.core.lease import skew_allowance

    faults = dict(world.store.injected)
    edge = 0.9 * skew_allowance(world.plan.ttl)
    counts = {
        "pause": sum(1 for c in world.contenders.values() if c.pauses),
        "kill": sum(1 for c in world.contenders.values() if c.killed),
        "lock break": len(world.plan.breaks),
        "lock break --force of a live holder": len(world.forced_live),
        "store ignoring delete conditions": int(world.plan.faults.delete_conditions == "ignore"),
        "store refusing delete conditions": int(world.plan.faults.delete_conditions == "refuse"),
        "clock at the edge of the allowance": sum(
            1 for spec in world.plan.contenders if abs(spec["offset"]) > edge
        ),
    }
    faults.update({name: n for name, n in counts.items() if n})
    return faults


@dataclass
class Budget:
    """What a run of many seeds did."""

    schedules: int = 0
    checks: int = 0
    steps: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    failures: list[Result] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, result: Result) -> None:
        self.schedules += 1
        self.checks += result.checks
        self.steps += result.steps
        for name, count in result.faults.items():
            self.faults[name] = self.faults.get(name, 0) + count
        if not result.ok:
            self.failures.append(result)


def many(seeds: Iterator[int] | range, *, stop_at_first: bool = True, **kwargs: object) -> Budget:
    budget = Budget()
    started = time.process_time()
    for seed in seeds:
        result = simulate(seed, **kwargs)  # type: ignore[arg-type]
        budget.add(result)
        if not result.ok and stop_at_first:
            break
    budget.seconds = time.process_time() - started
    return budget
