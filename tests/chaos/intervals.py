"""Merging the holders' interval logs and checking that no two holders held at once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Held:
    """One holder's claim: it held the lease from ``got`` until ``until``."""

    pid: int
    round: int
    kind: str
    got: float
    until: float
    errors: int
    raw: dict[str, Any]


def read_logs(paths: list[Path]) -> list[Held]:
    found = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            raw = json.loads(line)
            if raw.get("got") is None or raw.get("until") is None:
                found.append(Held(raw["pid"], raw["round"], raw["kind"], 0.0, 0.0, 0, raw))
                continue
            found.append(
                Held(
                    raw["pid"],
                    raw["round"],
                    raw["kind"],
                    raw["got"],
                    raw["until"],
                    raw.get("errors", 0),
                    raw,
                )
            )
    return found


def overlaps(held: list[Held]) -> list[tuple[Held, Held]]:
    """Pairs of intervals that overlap, in time order (an empty list: mutual exclusion held)."""
    timed = sorted((h for h in held if h.until > 0), key=lambda h: h.got)
    found = []
    latest: Held | None = None  # the interval reaching furthest so far
    for h in timed:
        if latest is not None and h.got < latest.until:
            found.append((latest, h))
        if latest is None or h.until > latest.until:
            latest = h
    return found


def describe(pairs: list[tuple[Held, Held]], limit: int = 5) -> str:
    lines = []
    for a, b in pairs[:limit]:
        lines.append(
            f"pid {a.pid} round {a.round} held [{a.got:.6f}, {a.until:.6f}) and "
            f"pid {b.pid} round {b.round} held [{b.got:.6f}, {b.until:.6f}): "
            f"{(a.until - b.got) * 1000:.3f} ms together"
        )
    return "\n".join(lines)
