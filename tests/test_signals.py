"""A stop signal is acted on at once, and never leaves a lock taken.

The checkpointer's lock, shared by the pump and the heartbeat that writes the
checkpoints, is taken under ``signals.HELD``: a signal handler that raises between a
lock's acquisition and the start of its ``with`` block leaves the lock held for good, and
the run then hangs at exit waiting for it (seen as a filter that never ended after
SIGTERM). These tests send the signal while the main thread waits for the lock, held by
another thread that lets it go afterwards.

A signal that lands just before the main thread blocks in a read or a wait for a child,
or that the kernel gives to another thread, interrupts nothing: its handler waited for the
read to return (seen as a filter on an idle tap that ignored SIGTERM, 2 to 4 times in
1,000 on a loaded machine). These tests give the signal to another thread, which makes
that case certain.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from mapper_state import signals
from mapper_state.core.checkpoint import Checkpointer
from mapper_state.errors import Interrupted
from mapper_state.stream.pump import LineScanner, pump


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


@contextlib.contextmanager
def _signal_sent_to_another_thread(signum: int) -> Iterator[None]:
    """Within the block, a thread sends ``signum`` to itself: the main thread, waiting in
    the block, is not interrupted. The block ends only after it was sent."""

    def send() -> None:
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signum)

    thread = threading.Thread(target=send)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def test_a_stop_signal_ends_a_pump_that_waits_for_input() -> None:
    read_end, write_end = os.pipe()
    sink = os.open(os.devnull, os.O_WRONLY)
    input_came = threading.Event()

    def input_much_later() -> None:  # so that the test ends, even when the signal is missed
        if not input_came.wait(10):
            os.write(write_end, b"{}\n")
            input_came.set()

    rescuer = threading.Thread(target=input_much_later)
    rescuer.start()
    try:
        with (
            signals.raising(),
            pytest.raises(Interrupted) as caught,
            _signal_sent_to_another_thread(signal.SIGTERM),
        ):
            pump(read_end, sink, LineScanner(lambda value: None, lambda why: None))
        missed = input_came.is_set()
    finally:
        input_came.set()
        rescuer.join()
        for fd in (read_end, write_end, sink):
            os.close(fd)
    assert not missed, "the signal was acted on only when input came"
    assert caught.value.exit_code == 128 + signal.SIGTERM


def test_a_forwarded_signal_reaches_the_child_being_waited_for() -> None:
    child = subprocess.Popen(["sleep", "10"])  # ends by itself if the signal is missed
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    try:
        with _signal_sent_to_another_thread(signal.SIGTERM), signals.waking():
            code = signals.wait_process(child)
    finally:
        signal.signal(signal.SIGTERM, previous)
        child.kill()
        child.wait()
    assert code == -signal.SIGTERM, "the child ended by itself: the signal was not forwarded"
