"""One schedule: a world of contenders for one state ID, built from a seed, run, checked.

The seed chooses everything: how many contenders and of which kind, each one's clock
(offset and drift within the skew allowance, or at its edge), the lease's TTL, when
each starts, how long its input stays idle, the network's faults and their rates, the
kind of store (delete conditions enforced, ignored, or refused), pauses, kills and an
operator's ``lock break``. The contenders run the project's own code:

- **run** (the filter and ``run``): a :class:`~mapper_state.core.session.Session`, as
  ``modes/filter.py`` and ``modes/pipeline.py`` wire it: lease, the prior state handed
  over (fenced after a takeover), checkpoints through the heartbeat, the stream stopped
  when the lease is lost (the pump's wake-up), the last state at the end, release;
- **exec**: a :class:`~mapper_state.core.lease.Lease` with its heartbeat, whose loss
  stops the command (as ``modes/exec.py`` does), and inside it a run writing under the
  inherited lease (``core/inherited.py``), as a filter inside ``mapper-state exec`` or a
  Meltano run under the whole-run lease does;
- **operator**: ``lock break`` (``core/lease/protocol.break_lease``) at a moment the seed
  chooses.

Each holder's state carries a counter it increments per record from the state it was
handed; :mod:`tests.simulation.invariants` checks the store's true history.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mapper_state import runtime
from mapper_state.config import load_settings
from mapper_state.core import inherited
from mapper_state.core.lease import Lease, break_lease, lease_key, skew_allowance
from mapper_state.core.session import Session
from mapper_state.errors import LeaseBusy, LeaseLost, MapperStateError
from mapper_state.settings import Settings
from mapper_state.stores.base import StoreError
from tests.simulation.scheduler import Clock, Contender, Killed, Sim, SimRuntime
from tests.simulation.store import Faults, SimStore

STATE_ID = "sim:pipeline"


@dataclass
class Plan:
    """What the seed chose for one schedule (printed with a failing trace)."""

    seed: int
    ttl: float
    faults: Faults
    contenders: list[dict[str, Any]] = field(default_factory=list)
    #: When an operator runs ``lock break`` (true times).
    breaks: list[float] = field(default_factory=list)
    force_break: bool = False
    #: The scheduler's own seed, when shrinking chose another than ``seed`` (a smaller
    #: world meets the failure in another interleaving).
    schedule: int | None = None
    #: What one store call may spend (its own bound): ``None`` is a third of the TTL, the
    #: bound a run opens its store with (``retry_deadline_seconds``).
    call_seconds: float | None = None

    def describe(self) -> str:
        lines = [
            f"seed {self.seed}: TTL {self.ttl:g} s, skew allowance {skew_allowance(self.ttl):g} s, "
            f"faults {self.faults}"
            + (f", schedule seed {self.schedule}" if self.schedule is not None else "")
            + (f", store calls end within {self.call_seconds:g} s" if self.call_seconds else ""),
        ]
        for c in self.contenders:
            lines.append("  " + ", ".join(f"{k}={v}" for k, v in c.items()))
        if self.breaks:
            at = ", ".join(f"{b:.3f}" for b in self.breaks)
            lines.append(f"  lock break{' --force' if self.force_break else ''} at {at}")
        return "\n".join(lines)


@dataclass
class Events:
    """What contenders did that the store does not show: data passed on, what each learned,
    how each ended."""

    passed: list[tuple[float, str]] = field(default_factory=list)
    learned_lost: dict[str, float] = field(default_factory=dict)
    #: Why each learned it (the lost lease's message), where the contender was told why.
    lost_reason: dict[str, str] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)
    handed: dict[str, int] = field(default_factory=dict)
    said: dict[str, list[str]] = field(default_factory=dict)


def plan(seed: int, *, edge_clocks: bool | None = None) -> Plan:
    """The world a seed gives."""
    import random

    rng = random.Random(seed ^ 0x5EED)
    ttl = rng.choice([3.0, 4.0, 6.0, 9.0])
    faulty = rng.random() < 0.8
    faults = Faults(
        answer_lost=rng.uniform(0, 0.08) if faulty else 0.0,
        not_applied=rng.uniform(0, 0.08) if faulty else 0.0,
        slow_answer=rng.uniform(0, 0.05) if faulty else 0.0,
        delete_conditions=rng.choice(["enforce", "enforce", "ignore", "refuse"]),
    )
    skew = skew_allowance(ttl)
    edge = rng.random() < 0.3 if edge_clocks is None else edge_clocks
    world = Plan(seed, ttl, faults)
    for i in range(rng.randint(2, 5)):
        offset = rng.choice([-skew, skew]) * 0.98 if edge else rng.uniform(-skew, skew) * 0.9
        world.contenders.append(
            {
                "name": f"c{i}",
                "kind": rng.choice(["run", "run", "exec"]),
                "offset": round(offset, 4),
                "drift": round(rng.uniform(-2e-5, 2e-5), 7),
                "start": round(rng.uniform(0, ttl), 3),
                "records": rng.randint(1, 8),
                "idle": round(rng.choice([0.1, 0.5, ttl / 2, 2 * ttl]), 3),
                "wait": rng.choice([0.0, ttl, 3 * ttl]),
                "pause_at": round(rng.uniform(0, 4 * ttl), 3) if rng.random() < 0.3 else None,
                "pause_for": round(rng.choice([ttl / 4, ttl, 3 * ttl]), 3),
                "kill_at": round(rng.uniform(0, 4 * ttl), 3) if rng.random() < 0.2 else None,
                # frozen or killed at a step (a store call) rather than at a moment
                "pause_rate": rng.choice([0.0, 0.0, 0.01, 0.03]),
                "kill_rate": rng.choice([0.0, 0.0, 0.0, 0.01]),
            }
        )
    if rng.random() < 0.3:
        world.breaks = [round(rng.uniform(0, 4 * ttl), 3)]
        world.force_break = rng.random() < 0.3
    return world


class World:
    """A plan made real: the scheduler, the store, the contenders' programs."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.sim = Sim(plan.seed if plan.schedule is None else plan.schedule, horizon=60 * plan.ttl)
        call_seconds = plan.call_seconds or plan.ttl / 3
        self.store = SimStore(self.sim, plan.faults, lease_key(STATE_ID), call_seconds)
        self.events = Events()
        self.contenders: dict[str, Contender] = {}
        self.kinds = {spec["name"]: spec["kind"] for spec in plan.contenders}
        #: Owners whose lease an operator forced while they ran: guarantee 3 given up.
        self.forced_live: set[str] = set()
        self.owners: dict[str, str] = {}
        self.wakes: dict[str, Any] = {}
        #: Called as a contender passes a record on (the invariants' monitor).
        self.on_passed: Callable[[float, str], None] = lambda at, name: None

    def settings(self, spec: dict[str, Any]) -> Settings:
        return load_settings(
            flags={
                "state_id": STATE_ID,
                "state_backend.lock_timeout_seconds": self.plan.ttl,
                "state_backend.lock_retry_seconds": self.plan.ttl / 6,
                "state_backend.lock_wait_seconds": spec["wait"],
                "checkpoint_interval_seconds": self.plan.ttl / 4,
            },
            env={},
        )

    # -- building and running ----------------------------------------------------------
    def run(self) -> None:
        sim = self.sim
        for spec in self.plan.contenders:
            c = sim.contender(spec["name"], Clock(spec["offset"], spec["drift"]))
            c.pause_rate = spec.get("pause_rate", 0.0)
            c.pause_range = (0.05 * self.plan.ttl, 1.5 * self.plan.ttl)
            c.kill_rate = spec.get("kill_rate", 0.0)
            self.contenders[c.name] = c
            program = self._run_program if spec["kind"] == "run" else self._exec_program
            thread = sim.spawn(c, functools.partial(program, c, spec), "main")
            sim.at(spec["start"], thread.start)
            if spec["pause_at"] is not None:
                sim.at(spec["pause_at"], functools.partial(sim.pause, c, spec["pause_for"]))
            if spec["kill_at"] is not None:
                sim.at(spec["kill_at"], functools.partial(self._kill, c))
        for n, at in enumerate(self.plan.breaks):
            operator = sim.contender(f"operator{n}", Clock())
            thread = sim.spawn(operator, self._operator, "main")
            sim.at(at, thread.start)
        with runtime.use(SimRuntime(sim)), self._wake_patched():
            sim.run()

    def _kill(self, c: Contender) -> None:
        self.sim.kill(c)

    @contextlib.contextmanager
    def _wake_patched(self) -> Iterator[None]:
        """What a process has that simulated threads do not, stood in for: the pump's
        wake-up (``signals.wake_main``: a signal to the main thread) becomes the contender's
        input wake-up; log lines go to the trace; run IDs come from the seed."""
        from mapper_state import log, signals
        from mapper_state.core.lease import driver

        ids = (f"{self.plan.seed % 10**6:06d}{n:06d}" for n in range(10**6))

        def wake_main() -> None:  # called by a session that learned its lease is lost
            who = self.sim.current_contender()
            if who is not None:
                self.events.learned_lost.setdefault(who.name, self.sim.now)
                if who.name in self.wakes:
                    self.wakes[who.name].set()

        def emit(level: str, message: str, detail: str = "", **fields: Any) -> None:
            self.sim.log(f"[{level}] {message}")
            who = self.sim.current_contender()
            if who is not None:
                self.events.said.setdefault(who.name, []).append(message)

        with contextlib.ExitStack() as stack:
            for owner, name, stand_in in (
                (signals, "wake_main", wake_main),
                (log, "emit", emit),
                (driver, "new_run_id", lambda: next(ids)),
            ):
                stack.callback(setattr, owner, name, getattr(owner, name))
                setattr(owner, name, stand_in)
            yield

    # -- the programs ------------------------------------------------------------------
    def _stream(self, c: Contender, spec: dict[str, Any], session: Session) -> None:
        """The filter's loop: wait for input (woken by a lost lease), stop if the lease is
        lost, pass the record on, offer the next state."""
        assert session.prior is not None
        prior = session.prior.value if session.prior.exists else None
        counter = int(prior["n"]) if isinstance(prior, dict) and "n" in prior else 0
        self.events.handed[c.name] = counter
        wake = self.wakes[c.name] = runtime.event()
        for _ in range(spec["records"]):
            self._learning(c, session.check)  # stopped meanwhile: nothing more to wait for
            c.doing = "waiting for input"
            wake.wait(spec["idle"])
            wake.clear()
            self._learning(c, session.check)  # the stream stops when the lease is lost
            c.doing = "passing data"
            self.events.passed.append((self.sim.now, c.name))
            self.on_passed(self.sim.now, c.name)
            counter += 1
            session.offer({"n": counter, "bookmarks": {"s": {"n": counter}}})
        c.doing = "finishing"
        self._learning(c, session.finish)

    def _learning(self, c: Contender, step: Callable[[], object]) -> None:
        """Run ``step``; a lost lease it raises is the moment ``c`` learned it."""
        try:
            step()
        except LeaseLost as exc:
            self.events.learned_lost.setdefault(c.name, self.sim.now)
            self.events.lost_reason.setdefault(c.name, exc.message)
            raise

    def _run_program(self, c: Contender, spec: dict[str, Any]) -> None:
        self._ending(c, lambda: self._session(c, spec, env={}))

    def _session(self, c: Contender, spec: dict[str, Any], env: dict[str, str]) -> None:
        c.doing = "starting"
        session = Session(self.settings(spec), store=self.store, env=env)
        self.owners.setdefault(c.name, session.lease.owner)
        with session:
            self.sim.log(f"holds the lease (run {session.lease.run_id})")
            self._stream(c, spec, session)
        self.sim.log("released")

    def _exec_program(self, c: Contender, spec: dict[str, Any]) -> None:
        def body() -> None:
            settings = self.settings(spec)
            lease = Lease.for_settings(self.store, STATE_ID, settings)
            stop = runtime.event()
            self.owners[c.name] = lease.owner
            try:
                c.doing = "starting (exec)"
                lease.acquire()
                self.sim.log(f"exec holds the lease (run {lease.run_id})")
                lease.start_heartbeat(on_lost=lambda error: self._stop_command(c, stop, error))
                held = inherited.HeldLease(STATE_ID, lease.run_id, self.store.display_uri)
                env = inherited.with_held(held, {})
                self._command(c, spec, env, stop)
            finally:
                lease.release()
                self.sim.log("exec released")

        self._ending(c, body)

    def _stop_command(self, c: Contender, stop: Any, error: LeaseLost) -> None:
        """exec's reaction to a lost lease: stop the command (it is one process here)."""
        self.events.learned_lost.setdefault(c.name, self.sim.now)
        self.events.lost_reason.setdefault(c.name, error.message)
        stop.set()
        if c.name in self.wakes:
            self.wakes[c.name].set()

    def _command(self, c: Contender, spec: dict[str, Any], env: dict[str, str], stop: Any) -> None:
        """The command inside exec: a run writing under the inherited lease, stopped when
        exec stops it."""
        c.doing = "command starting"
        with Session(self.settings(spec), store=self.store, env=env) as session:
            original = session.check

            def check() -> None:
                if stop.is_set():
                    raise LeaseLost("the command was stopped: exec lost its lease")
                original()

            session.check = check  # type: ignore[method-assign]
            self._stream(c, spec, session)

    def _operator(self) -> None:
        """``mapper-state lock break`` (``--force`` if the plan says so). A forced break of a
        live holder gives up guarantee 3 by definition (it passes data on until it notices:
        that is what a plain break waits for), never 1 and 2. A failure of the command is
        its error, nothing more."""
        force = self.plan.force_break
        flag = " --force" if force else ""
        try:
            holder = break_lease(self.store, STATE_ID, force=force)
        except MapperStateError as exc:
            self.sim.log(f"lock break{flag} failed: {exc.message}")
            return
        self.sim.log(f"lock break{flag}: {holder.describe() if holder else 'no lease'}")

    def _ending(self, c: Contender, body: Any) -> None:
        """Run ``body`` and note how the contender ended (as its exit code would say)."""
        try:
            body()
            self.events.outcome.setdefault(c.name, "succeeded")
        except Killed:
            raise
        except LeaseBusy:
            self.events.outcome.setdefault(c.name, "busy")
        except LeaseLost as exc:
            self.events.learned_lost.setdefault(c.name, self.sim.now)
            self.events.outcome.setdefault(c.name, f"lease-lost: {exc.message}")
        except StoreError as exc:
            self.events.outcome.setdefault(c.name, f"store-error: {exc.message}")
        except MapperStateError as exc:
            self.events.outcome.setdefault(c.name, f"error: {exc.message}")
        self.sim.log(f"ended: {self.events.outcome[c.name]}")
