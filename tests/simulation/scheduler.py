"""The deterministic scheduler: one simulated process runs at a time, chosen by the seed.

Each contender's threads (its main thread, its lease heartbeat) are real threads, but only
one of them runs at any moment: the one the scheduler hands the baton to. A thread gives
the baton back at every point where the real program could be overtaken: every store
call, every sleep, every wait on an event or a lock, every join. The scheduler then picks
the next thread among those ready, with the seed's random generator; when none is ready,
it moves the simulated clock to the next moment one is (a timer firing, a sleep ending).
Nothing here reads the real clock, so a seed gives the same schedule on every machine.

Contenders see time through :class:`SimRuntime` (installed with
``mapper_state.runtime.use``): each has its own clock, offset and drifting from the true
one, so the lease's skew allowance is exercised. A contender can be paused (a stop, a GC
pause, a frozen VM: its threads are not scheduled, its clock runs on) and killed (its
threads are unwound with :class:`Killed`, and nothing they do reaches the store again:
to the world it is a SIGKILL).
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mapper_state import runtime

#: The true clock's epoch: records carry real-looking times.
EPOCH = 1_800_000_000.0


class Killed(BaseException):
    """Raised in a killed contender's threads at their next step: they unwind, and nothing
    they do afterwards reaches the store."""


class Deadlock(Exception):
    """No thread can ever run again although some have not ended."""


@dataclass
class Clock:
    """A contender's view of time: ``offset`` seconds off the true clock, running
    ``1 + drift`` times as fast."""

    offset: float = 0.0
    drift: float = 0.0

    def wall(self, true: float) -> float:
        return EPOCH + self.offset + true * (1 + self.drift)

    def mono(self, true: float) -> float:
        return 1000.0 + true * (1 + self.drift)

    def true_of_wall(self, wall: float) -> float:
        return (wall - EPOCH - self.offset) / (1 + self.drift)

    def true_seconds(self, local: float) -> float:
        """How many true seconds ``local`` seconds of this clock take."""
        return local / (1 + self.drift)


@dataclass
class Contender:
    """One simulated process: its name, clock and state (paused until, killed)."""

    name: str
    clock: Clock
    paused_until: float = 0.0
    killed: bool = False
    ended_at: float | None = None
    threads: list[SimThread] = field(default_factory=list)
    #: Set by the contender's program: what it is doing, for the trace.
    doing: str = ""
    pauses: list[tuple[float, float]] = field(default_factory=list)
    #: At each step (a store call), the chance it is frozen, for how long, or killed.
    pause_rate: float = 0.0
    pause_range: tuple[float, float] = (0.0, 0.0)
    kill_rate: float = 0.0

    def paused_extra(self, since: float) -> float:
        """Seconds this contender spent paused after ``since`` (true time)."""
        return sum(max(0.0, end - max(start, since)) for start, end in self.pauses)

    def alive(self) -> bool:
        return not self.killed and any(not t.done for t in self.threads)


class SimThread:
    """A real thread that runs only while the scheduler lets it."""

    def __init__(self, sim: Sim, contender: Contender, target: Callable[[], None], name: str):
        self.sim, self.contender, self.name = sim, contender, name
        self._target = target
        self._go = threading.Semaphore(0)
        self.done = False
        self.started = False
        self.error: BaseException | None = None
        self.ready: Callable[[], bool] | None = None
        self.until: float | None = None
        self._os = threading.Thread(target=self._main, name=f"sim-{contender.name}-{name}")
        self._os.daemon = True
        contender.threads.append(self)

    # the runtime.Thread surface
    def start(self) -> None:
        self.started = True
        self.ready, self.until = (lambda: True), None
        self._os.start()

    def join(self, timeout: float | None = None) -> None:
        self.sim.block(lambda: self.done, None if timeout is None else self.sim.later(timeout))

    def is_alive(self) -> bool:
        return self.started and not self.done

    def _main(self) -> None:
        self._go.acquire()
        try:
            if self.contender.killed:
                raise Killed
            self._target()
        except Killed:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported by the scheduler
            self.error = exc
        finally:
            self.done = True
            if self.contender.ended_at is None and all(t.done for t in self.contender.threads):
                self.contender.ended_at = self.sim.now
            self.sim._baton.release()

    def runnable(self, now: float) -> bool:
        if not self.started or self.done:
            return False
        if self.contender.killed:
            return True  # to unwind
        if self.contender.paused_until > now:
            return False
        return (self.ready is not None and self.ready()) or (
            self.until is not None and now >= self.until
        )


class Sim:
    """The scheduler and the true clock of one schedule."""

    def __init__(self, seed: int, *, horizon: float = 600.0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.horizon = horizon
        self.contenders: list[Contender] = []
        self.threads: list[SimThread] = []
        self.trace: list[str] = []
        self.steps = 0
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._baton = threading.Semaphore(0)
        self._running: SimThread | None = None
        #: Called after every step, from the scheduler (the invariants).
        self.after_step: Callable[[], None] = lambda: None

    # -- building a world --------------------------------------------------------------
    def contender(self, name: str, clock: Clock) -> Contender:
        c = Contender(name, clock)
        self.contenders.append(c)
        return c

    def spawn(self, contender: Contender, target: Callable[[], None], name: str) -> SimThread:
        thread = SimThread(self, contender, target, name)
        self.threads.append(thread)
        return thread

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` in the scheduler at true time ``when`` (a fault, a late answer)."""
        heapq.heappush(self._timers, (when, next(self._seq), action))

    def log(self, what: str) -> None:
        who = self.current_contender()
        name = who.name if who else "world"
        local = f" ({who.clock.wall(self.now) - EPOCH:.3f})" if who else ""
        self.trace.append(f"{self.now:9.3f}{local} {name}: {what}")

    # -- what a simulated thread calls -------------------------------------------------
    def current(self) -> SimThread | None:
        running = self._running
        if running is not None and threading.current_thread() is running._os:
            return running
        return None

    def current_contender(self) -> Contender | None:
        thread = self.current()
        return thread.contender if thread else None

    def later(self, local_seconds: float) -> float:
        """The true time ``local_seconds`` of the running contender's clock from now."""
        who = self.current_contender()
        seconds = max(0.0, local_seconds)
        return self.now + (who.clock.true_seconds(seconds) if who else seconds)

    def block(self, ready: Callable[[], bool] | None, until: float | None) -> None:
        """Give the baton back until ``ready()`` holds or true time ``until`` comes (either
        may be ``None``); the scheduler may run others first in any case."""
        thread = self.current()
        if thread is None:
            raise RuntimeError("a simulated wait outside a simulated thread")
        if thread.contender.killed:
            raise Killed
        thread.ready, thread.until = ready, until
        self._baton.release()
        thread._go.acquire()
        if thread.contender.killed:
            raise Killed

    def step(self) -> None:
        """A point where the running thread may be overtaken (before a store call), and
        where its process may be frozen or killed, as the seed says (any step may be one)."""
        who = self.current_contender()
        if who is not None and not who.killed:
            if who.pause_rate and self.rng.random() < who.pause_rate:
                self.pause(who, self.rng.uniform(*who.pause_range))
            elif who.kill_rate and self.rng.random() < who.kill_rate:
                self.kill(who)
        self.block(lambda: True, None)

    # -- the scheduler -----------------------------------------------------------------
    def run(self) -> None:
        """Run until every thread has ended; raise what a thread raised, or
        :class:`Deadlock`."""
        while True:
            self._fire_timers()
            live = [t for t in self.threads if t.started and not t.done]
            if not live and not self._timers:
                return
            ready = [t for t in live if t.runnable(self.now)]
            if not ready:
                self._advance(live)
                continue
            thread = ready[self.rng.randrange(len(ready))]
            self._running = thread
            self.steps += 1
            thread._go.release()
            self._baton.acquire()
            self._running = None
            if thread.error is not None:
                raise thread.error
            self.after_step()

    def _fire_timers(self) -> None:
        while self._timers and self._timers[0][0] <= self.now:
            _, _, action = heapq.heappop(self._timers)
            action()
            self.after_step()

    def _advance(self, live: list[SimThread]) -> None:
        moments = [t.until for t in live if t.until is not None]
        moments += [t.contender.paused_until for t in live if t.contender.paused_until > self.now]
        if self._timers:
            moments.append(self._timers[0][0])
        later = [m for m in moments if m > self.now]
        if not later:
            waiting = ", ".join(f"{t.contender.name}/{t.name}" for t in live)
            raise Deadlock(f"nothing can run at {self.now:.3f}: {waiting}")
        self.now = min(later)
        if self.now > self.horizon:
            waiting = ", ".join(f"{t.contender.name}/{t.name} ({t.contender.doing})" for t in live)
            raise Deadlock(f"still running after {self.horizon:g} s: {waiting}")

    def kill(self, contender: Contender) -> None:
        """SIGKILL: its threads unwind at their next step, touching nothing outside."""
        if not contender.killed and contender.alive():
            contender.killed = True
            self.log(f"KILLED {contender.name}")

    def pause(self, contender: Contender, seconds: float) -> None:
        contender.paused_until = max(contender.paused_until, self.now + seconds)
        contender.pauses.append((self.now, self.now + seconds))
        self.log(f"PAUSED {contender.name} for {seconds:.3f} s")


class SimRuntime:
    """``mapper_state.runtime.Runtime`` over the scheduler: each contender's own clock.

    A thread that is not simulated (one a test before left running) gets the real runtime,
    so that it neither blocks the schedule nor is blocked by it.
    """

    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def _clock(self) -> Clock | None:
        who = self.sim.current_contender()
        return who.clock if who else None

    def _outside(self) -> bool:
        return self.sim.current() is None

    def time(self) -> float:
        if self._outside():
            return runtime.REAL.time()
        clock = self._clock()
        return clock.wall(self.sim.now) if clock else EPOCH + self.sim.now

    def monotonic(self) -> float:
        if self._outside():
            return runtime.REAL.monotonic()
        clock = self._clock()
        return clock.mono(self.sim.now) if clock else 1000.0 + self.sim.now

    def sleep(self, seconds: float) -> None:
        if self._outside():
            runtime.REAL.sleep(seconds)
            return
        self.sim.block(None, self.sim.later(seconds))

    def event(self) -> runtime.Event:
        return runtime.REAL.event() if self._outside() else SimEvent(self.sim)

    def lock(self) -> runtime.Lock:
        return runtime.REAL.lock() if self._outside() else SimLock(self.sim)

    def thread(self, target: Callable[[], None], name: str) -> runtime.Thread:
        who = self.sim.current_contender()
        if who is None:
            return runtime.REAL.thread(target, name)
        return self.sim.spawn(who, target, name)

    def current_thread(self) -> Any:
        return self.sim.current() or runtime.REAL.current_thread()

    def host(self) -> str:
        """Each contender its own host, named for it: nothing of the real machine reaches
        a record or the trace, so a seed replays the same trace on any machine."""
        who = self.sim.current_contender()
        return f"host-{who.name}" if who else "host-world"

    def pid(self) -> int:
        who = self.sim.current_contender()
        return 1000 + self.sim.contenders.index(who) if who else 999


class SimEvent:
    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        if self.sim.current() is None:  # the scheduler's own thread: nothing to wait for
            return self._set
        until = None if timeout is None else self.sim.later(timeout)
        self.sim.block(lambda: self._set, until)
        return self._set


class SimLock:
    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self._held = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._held:
            self._held = True
            return True
        if not blocking:
            return False
        until = None if timeout is None or timeout < 0 else self.sim.later(timeout)
        self.sim.block(lambda: not self._held, until)
        return self._take()

    def _take(self) -> bool:
        """Take the lock if it is free (after a wait: it may have timed out taken)."""
        if self._held:
            return False
        self._held = True
        return True

    def release(self) -> None:
        self._held = False

    def __enter__(self) -> SimLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
