"""Starting contenders together in threads, and not letting a crashed one pass as a loser.

Each contender returns whether it won; one that raises anything else makes the race
fail with its exception, instead of being counted as having lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


def race(contenders: Sequence[Callable[[], bool]]) -> list[int]:
    """Run every contender at the same moment; return the indexes of those that won."""
    barrier = threading.Barrier(len(contenders))
    won: list[int] = []
    crashed: list[BaseException] = []
    lock = threading.Lock()

    def run(i: int, contender: Callable[[], bool]) -> None:
        try:
            barrier.wait()
            if contender():
                with lock:
                    won.append(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread below
            with lock:
                crashed.append(exc)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if crashed:
        raise AssertionError(f"{len(crashed)} contender(s) crashed") from crashed[0]
    return sorted(won)
