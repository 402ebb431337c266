"""The scoreboard's pictures, drawn with matplotlib (Agg, no display) from the results.

Each function takes one section's ``data`` (as written to ``results/<name>.json``) and
writes one PNG; :data:`PICTURES` names which section each picture is drawn from.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import ScalarFormatter

OURS, THEIRS, REFERENCE = "#1f77b4", "#d62728", "#7f7f7f"
FLOOR = 1e-3  # log axes cannot show zero or a noisy negative slope


def _bars(ax: Axes, labels: list[str], values: list[float], colors: list[str], unit: str) -> None:
    shown = [max(v, FLOOR) for v in values]
    bars = ax.bar(labels, shown, color=colors)
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(
            f"{value:,.3g} {unit}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.tick_params(axis="x", labelsize=8)


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def throughput(data: dict[str, Any], path: Path) -> None:
    """Throughput and CPU per GB (slopes, log scale): cat, mapper-state, meltano-map-transform."""
    slopes = data["slope"]["contenders"]
    names = [n for n in ("cat", "mapper-state", "meltano-map-transform") if n in slopes]
    colors = {"cat": REFERENCE, "mapper-state": OURS, "meltano-map-transform": THEIRS}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, unit, title in (
        (left, "mb_per_s", "MB/s", "throughput, MB/s (higher is better)"),
        (right, "cpu_s_per_gb", "s/GB", "user+system CPU per GB (lower is better)"),
    ):
        _bars(ax, names, [slopes[n][key] for n in names], [colors[n] for n in names], unit)
        ax.set_yscale("log")
        ax.set_title(title)
    a, b = data["slope"]["between_lines"]
    fig.suptitle(f"cat FILE | X | cat >/dev/null, slope between {a:,} and {b:,} lines", fontsize=10)
    _save(fig, path)


def pipeline(data: dict[str, Any], path: Path) -> None:
    """Wall time and CPU of tap-sample -> target-jsonl, per way of running it."""
    contenders = data["contenders"]
    names = list(contenders)
    colors = [REFERENCE, OURS, OURS, THEIRS][: len(names)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    _bars(left, names, [contenders[n]["wall_s"] for n in names], colors, "s")
    left.set_title("wall time, s")
    _bars(right, names, [contenders[n]["cpu_s"] for n in names], colors, "s")
    right.set_title("user+system CPU, s")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=15)
    fig.suptitle(f"tap-sample -> target-jsonl, {data['records']:,} records", fontsize=10)
    _save(fig, path)


def requests(data: dict[str, Any], path: Path) -> None:
    """Requests to S3 per run, per tool and scenario."""
    scenarios = data["scenarios"]
    labels = [textwrap.fill(f"{s['tool']}: {s['scenario']}", 70) for s in scenarios]
    counts = [s["requests"] for s in scenarios]
    colors = [THEIRS if s["tool"] == "Meltano 4.4" else OURS for s in scenarios]
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(labels) + 1.2))
    rows = list(range(len(labels)))
    ax.barh(rows, counts, color=colors)
    ax.set_yticks(rows, labels)
    for row, count in zip(rows, counts, strict=True):
        ax.annotate(
            str(count),
            (count, row),
            va="center",
            fontsize=8,
            xytext=(3, 0),
            textcoords="offset points",
        )
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("requests per run (counted at mitmproxy in front of moto)")
    _save(fig, path)


def operator(data: dict[str, Any], path: Path) -> None:
    """Requests and wall time of the operator commands against the number of state IDs."""
    results = data["results"]
    history = _most_common_history(results)
    fig, (req, wall, hist) = plt.subplots(1, 3, figsize=(14, 4))
    commands = list(dict.fromkeys(r["command"] for r in results))
    for command in commands:
        points = sorted(
            (r["state_ids"], r["requests"], r["wall_s"])
            for r in results
            if r["command"] == command and r["history"] == history
        )
        if len(points) < 2:
            continue
        style = "--" if command.startswith("meltano") else "-"
        ids = [p[0] for p in points]
        req.plot(ids, [p[1] for p in points], style, marker="o", label=command)
        wall.plot(ids, [p[2] for p in points], style, marker="o", label=command)
        by_length = sorted(
            (r["history"], r["requests"])
            for r in results
            if r["command"] == command and r["state_ids"] == _history_ids(results)
        )
        if len(by_length) > 1:
            hist.plot(
                [p[0] for p in by_length],
                [p[1] for p in by_length],
                style,
                marker="o",
                label=command,
            )
    for ax, title in (
        (req, f"requests ({history} snapshots per ID)"),
        (wall, f"wall time, s ({history} snapshots per ID)"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("state IDs in the bucket")
        ax.set_title(title)
        ax.legend(fontsize=7)
    hist.set_xlabel("history snapshots per state ID")
    hist.set_yscale("log")
    hist.yaxis.set_major_formatter(ScalarFormatter())
    hist.set_title(f"requests at {_history_ids(results):,} state IDs")
    hist.legend(fontsize=7)
    _save(fig, path)


def _most_common_history(results: list[dict[str, Any]]) -> int:
    counts: dict[int, int] = {}
    for r in results:
        counts[r["history"]] = counts.get(r["history"], 0) + 1
    return max(counts, key=lambda h: counts[h])


def _history_ids(results: list[dict[str, Any]]) -> int:
    """The state ID count of the buckets that vary the history length."""
    lengths: dict[int, set[int]] = {}
    for r in results:
        lengths.setdefault(r["state_ids"], set()).add(r["history"])
    return max(lengths, key=lambda n: len(lengths[n]))


#: picture file name -> (section it is drawn from, how)
PICTURES: dict[str, tuple[str, Callable[[dict[str, Any], Path], None]]] = {
    "throughput.png": ("filter", throughput),
    "pipeline.png": ("pipeline", pipeline),
    "requests.png": ("requests", requests),
    "operator.png": ("operator", operator),
}
