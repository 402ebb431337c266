"""A stop signal never leaves a lock taken: the checkpointer's lock, shared by the pump and
the heartbeat that writes the checkpoints, is taken under ``signals.HELD``.

A signal handler that raises between a lock's acquisition and the start of its ``with``
block leaves the lock held for good, and the run then hangs at exit waiting for it (seen
as a filter that never ended after SIGTERM). These tests send the signal while the main
thread waits for the lock, held by another thread that lets it go afterwards.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from mapper_state import signals
from mapper_state.core.checkpoint import Checkpointer
from mapper_state.errors import Interrupted


def _signal_in_a_held_block(reached: list[str]) -> None:
    with signals.HELD:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler has run by now
        reached.append("the end of the block")


def test_a_signal_in_a_held_block_is_raised_when_the_block_ends() -> None:
    reached: list[str] = []
    with signals.raising(), pytest.raises(Interrupted) as caught:
        _signal_in_a_held_block(reached)
    assert reached == ["the end of the block"]
    assert caught.value.exit_code == 128 + signal.SIGTERM


def test_a_signal_while_the_pump_offers_a_state_leaves_the_lock_free() -> None:
    committed: list[object] = []
    checkpointer = Checkpointer(committed.append, interval=60, wake=lambda: None)
    lock = checkpointer._lock  # what the pump and the heartbeat share
    waiting = threading.Event()

    def hold_then_signal() -> None:
        with lock:
            waiting.wait(5)
            time.sleep(0.1)  # the main thread now waits for the lock
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)

    holder = threading.Thread(target=hold_then_signal)
    holder.start()
    try:
        waiting.set()  # the signal comes 0.1 s later, into offer()'s wait for the lock
        with signals.raising(), pytest.raises(Interrupted):
            checkpointer.offer({"n": 1})
    finally:
        holder.join()
    assert lock.acquire(timeout=1), "the checkpointer's lock was left taken"
    lock.release()
    # the offer completed before the signal was raised, so finishing still writes it
    assert checkpointer.finish()
    assert committed == [{"n": 1}]
