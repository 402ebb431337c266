"""Shrinking a failing schedule: the smallest world the seed still breaks the same way.

A failing seed's world may hold five contenders, three kinds of network fault, pauses,
kills and a ``lock break``, most of which have nothing to do with the failure. Shrinking
tries simpler worlds, one change at a time (a contender, a break, a fault class, a pause or
a kill taken out; fewer records; a clock set right), each run under the same seed, and
keeps a change when the schedule still breaks the same invariant. It stops when no single
change keeps the failure. Like the schedule itself it reads nothing but the seed, so the
shrunk world and its trace are the same on every machine: ``make simulate SEED=S SHRINK=1``.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Iterator

from tests.simulation.run import Result, simulate
from tests.simulation.variants import Variant
from tests.simulation.world import Plan, plan

#: At most this many schedules are run while shrinking (each takes milliseconds).
MAX_TRIES = 600
#: Interleavings tried for a world with a contender fewer.
SCHEDULES_PER_WORLD = 8


def shrink(seed: int, *, variant: Variant | None = None) -> tuple[Result, Result]:
    """The failing schedule of ``seed`` and the smallest one found that fails the same way;
    ``ValueError`` when the seed does not fail."""
    world = variant.adjust(plan(seed)) if variant else plan(seed)
    first = _run(world, variant)
    if first.ok:
        raise ValueError(f"seed {seed} breaks no invariant: nothing to shrink")
    same = _failure_kind(first)
    best, best_world, tries = first, world, 0
    changed = True
    while changed and tries < MAX_TRIES:
        changed = False
        for candidate in _simpler(best_world):
            for schedule in _schedules(candidate, best_world):
                tries += 1
                result = _run(schedule, variant)
                if _keeps(result, same, best):
                    best, best_world, changed = result, schedule, True
                    break
            if changed or tries >= MAX_TRIES:
                break  # start again from the smaller world, or stop
    return first, best


def _keeps(result: Result, same: str, best: Result) -> bool:
    """Does ``result`` fail as the original did, in a trace no longer than the best one?"""
    return not result.ok and _failure_kind(result) == same and len(result.trace) <= len(best.trace)


def _schedules(candidate: Plan, before: Plan) -> Iterator[Plan]:
    """``candidate`` under its schedule seed, then, where it has fewer contenders than
    ``before`` (which changes every interleaving after), under a few others."""
    yield candidate
    if len(candidate.contenders) < len(before.contenders):
        for n in range(1, SCHEDULES_PER_WORLD):
            other = copy.deepcopy(candidate)
            other.schedule = candidate.seed * 100 + n
            yield other


def _run(world: Plan, variant: Variant | None) -> Result:
    """The schedule of the world's seed in ``world`` (already adjusted to the variant)."""
    return simulate(world.seed, variant=variant, chosen=copy.deepcopy(world))


def _failure_kind(result: Result) -> str:
    """What a failure broke: ``invariant 3``, or the error's type."""
    found = re.search(r"invariant (\d)", str(result.failure))
    return found.group(0) if found else type(result.failure).__name__


#: What each contender is set to in the plainest world: no pause, kill or skew, one record.
PLAIN = {
    "pause_at": None,
    "kill_at": None,
    "pause_rate": 0.0,
    "kill_rate": 0.0,
    "offset": 0.0,
    "drift": 0.0,
    "records": 1,
    "wait": 0.0,
}


def _simpler(world: Plan) -> Iterator[Plan]:
    """Every world one change simpler than ``world``, the biggest changes first."""
    for edit in (*_world_edits(world), *_contender_edits(world)):
        other = copy.deepcopy(world)
        edit(other)
        yield other


def _world_edits(world: Plan) -> Iterator[Callable[[Plan], object]]:
    """A contender, the breaks, a fault class taken out."""
    if len(world.contenders) > 1:
        for i in range(len(world.contenders)):
            yield functools.partial(lambda w, at: w.contenders.pop(at), at=i)
    if world.breaks:
        yield lambda w: w.breaks.clear()
    if world.force_break:
        yield lambda w: setattr(w, "force_break", False)
    for fault in ("answer_lost", "not_applied", "slow_answer"):
        if getattr(world.faults, fault):
            yield functools.partial(lambda w, name: setattr(w.faults, name, 0.0), name=fault)
    if world.faults.delete_conditions != "enforce":
        yield lambda w: setattr(w.faults, "delete_conditions", "enforce")


def _contender_edits(world: Plan) -> Iterator[Callable[[Plan], object]]:
    """One of a contender's settings made plain (:data:`PLAIN`), or its records halved."""

    def set_to(w: Plan, at: int, key: str, value: object) -> None:
        w.contenders[at][key] = value

    for i, spec in enumerate(world.contenders):
        for key, value in PLAIN.items():
            if spec.get(key) != value:
                yield functools.partial(set_to, at=i, key=key, value=value)
        if spec.get("records", 1) > 2:
            yield functools.partial(set_to, at=i, key="records", value=spec["records"] // 2)


def report(first: Result, best: Result) -> str:
    """The shrunk failure as a report: the smaller world and its whole trace."""
    return "\n".join(
        [
            f"shrunk: {len(first.trace)} steps to {len(best.trace)}, "
            f"the same failure ({_failure_kind(best)})",
            best.report(tail=10**6),
            f"shrink again: make simulate SEED={best.seed} SHRINK=1",
        ]
    )
