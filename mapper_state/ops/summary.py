"""One line per history snapshot: which parts of the state changed since the one before.

``state history`` shows it beside each snapshot; ``state diff`` (:mod:`~mapper_state.ops.diff`)
gives the whole story, leaf by leaf.
"""

from __future__ import annotations

from typing import Any


def _changed_paths(old: Any, new: Any, path: str, depth: int) -> tuple[list[str], ...]:
    added: list[str] = []
    removed: list[str] = []
    changed: list[str] = []
    if old == new:
        return added, removed, changed
    if not isinstance(old, dict) or not isinstance(new, dict) or depth == 0:
        changed.append(path)
        return added, removed, changed
    for key in new:
        child = f"{path}.{key}" if path else str(key)
        if key not in old:
            added.append(child)
        elif old[key] != new[key]:
            # go one level into containers of per-stream entries such as ``bookmarks``
            a, r, c = _changed_paths(old[key], new[key], child, depth - 1)
            added += a
            removed += r
            changed += c
    removed += [f"{path}.{k}" if path else str(k) for k in old if k not in new]
    return added, removed, changed


def summarize_change(old: Any, new: Any, limit: int = 4) -> str:
    """A short description of what changed from ``old`` to ``new``, e.g. which bookmarks."""
    if old is None:
        return "first snapshot"
    if old == new:
        return "no change"
    added, removed, changed = _changed_paths(old, new, "", 2)
    parts = []
    for label, paths in (("changed", changed), ("added", added), ("removed", removed)):
        if paths:
            shown = ", ".join(paths[:limit])
            more = f" (+{len(paths) - limit} more)" if len(paths) > limit else ""
            parts.append(f"{label} {shown}{more}")
    return "; ".join(parts) or "changed"
