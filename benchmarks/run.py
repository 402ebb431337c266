"""The scoreboard: run every benchmark, write the results, draw the pictures.

    make bench                                   # python -m benchmarks.run
    python -m benchmarks.run --ten-million       # also a 10M-line stream (BENCH_TEN_MILLION=1)
    python -m benchmarks.run --scale tiny --out /tmp/b   # the smoke test's sizes
    python -m benchmarks.run --only filter,handover      # some sections only
    python -m benchmarks.run --publish           # also refresh the README's figures
    python -m benchmarks.run --publish-from DIR  # publish a finished run's results

Sections, each measured side by side with what a user would pick instead:

=========  ==========================================================================
filter     throughput and CPU per GB against ``cat`` and ``meltano-map-transform``,
           stream shapes, peak RSS, a slow store, start-up (``throughput.py``)
pipeline   tap-sample -> target-jsonl bare, through the filter, with ``run`` and with
           ``meltano run``; time to first byte (``pipeline.py``)
handover   a waiting run's first byte after the holder's release (``handover.py``)
operator   ``state list/get/export`` against ``meltano state list/get`` on buckets of
           many state IDs (``operator_commands.py``)
fleet      pipelines x replicas started at once on one bucket (``fleet.py``)
requests   requests per run on S3 against Meltano's S3 backend (``requests_per_run.py``)
meltano-   Meltano's S3 state backend against the add-on: requests per ``state set`` and
backend    per ``run``, ``state list`` of 5,000 IDs, the merge race (``meltano_backend.py``)
watch      one Prometheus scrape of ``metrics serve`` over 5,000 pipelines (``watch.py``)
=========  ==========================================================================

Results go to ``benchmarks/results/`` (regenerated, not committed): ``<section>.json``
(rows, notes and every raw figure), ``summary.json``, ``scoreboard.md`` (every table) and
the pictures ``throughput.png``, ``pipeline.png``, ``requests.png``, ``operator.png``.
``--publish`` copies the pictures to ``docs/images/`` and rewrites the README's figures
between its ``scoreboard`` markers, so the README's table and pictures always come from
one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks import (
    fleet,
    handover,
    meltano_backend,
    operator_commands,
    pipeline,
    requests_per_run,
    throughput,
    watch,
)
from benchmarks.common import (
    ROOT,
    SCALES,
    BenchError,
    Row,
    Scale,
    Section,
    with_ten_million,
)

Measure = Callable[[Scale, Callable[[str], None]], Section]
SECTIONS: dict[str, Measure] = {
    "filter": throughput.measure,
    "pipeline": pipeline.measure,
    "handover": handover.measure,
    "operator": operator_commands.measure,
    "fleet": fleet.measure,
    "requests": requests_per_run.measure,
    "meltano-backend": meltano_backend.measure,
    "watch": watch.measure,
}
HEADER = ["measure", "mapper-state", "compared with", "ratio / detail", "goal", "met"]
README = ROOT / "README.md"
IMAGES = ROOT / "docs" / "images"
START, END = "<!-- scoreboard:start -->", "<!-- scoreboard:end -->"


def table(section: Section) -> str:
    lines = [f"| {' | '.join(HEADER)} |", "|" + "---|" * len(HEADER)]
    for row in section.rows:
        cells = [c.replace("|", "\\|") for c in row.cells()]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def markdown(
    sections: list[Section],
    pictures: list[str],
    image: Callable[[str], str],
    machine: str,
    failed: dict[str, str],
) -> str:
    """Every section's table and notes, then the pictures (``image`` gives each one's path)."""
    parts = [machine, ""]
    if failed:
        parts += [f"**Failed in this run:** `{name}`: {error}" for name, error in failed.items()]
        parts.append("")
    for s in sections:
        parts += [f"#### {s.title}", "", table(s), ""]
        parts += [f"- {note}" for note in s.notes]
        if s.notes:
            parts.append("")
    parts += [f"![{p.removesuffix('.png')}]({image(p)})" for p in pictures]
    return "\n".join(parts).rstrip() + "\n"


def machine_line(scale: Scale, seconds: float, load: tuple[float, float]) -> str:
    return (
        f"Measured {datetime.now(UTC):%Y-%m-%d} with `make bench` (scale `{scale.name}`, "
        f"best of {scale.repeats}) in {seconds / 60:.1f} min on {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; load average {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end (other jobs shared the machine: ratios are side by side, "
        "absolute figures move between runs)."
    )


def publish(text_for_readme: str, out: Path, pictures: list[str]) -> None:
    """Copy the pictures to docs/images/ and put the figures between the README's markers."""
    IMAGES.mkdir(parents=True, exist_ok=True)
    for name in pictures:
        shutil.copy(out / name, IMAGES / f"bench-{name}")
    readme = README.read_text()
    if START not in readme or END not in readme:
        raise BenchError(f"README.md has no {START} ... {END} block to fill")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{text_for_readme}{END}{tail}")


def load_section(path: Path) -> Section:
    """A section as ``main`` wrote it to ``<name>.json``."""
    saved = json.loads(path.read_text())
    verdicts = {"yes": True, "**no**": False, "": None}
    measure, value, reference, ratio, goal, met = HEADER
    rows = [
        Row(r[measure], r[value], r[reference], r[ratio], r[goal], verdicts[r[met]])
        for r in saved["rows"]
    ]
    return Section(path.stem, saved["title"], rows, saved["data"], saved["notes"], saved["seconds"])


def publish_saved(out: Path) -> int:
    """Publish a finished run's results from ``out`` without measuring again."""
    summary = json.loads((out / "summary.json").read_text())
    sections = [load_section(out / f"{name}.json") for name in summary["sections"]]
    pictures = list(summary["pictures"])
    text = markdown(
        sections,
        pictures,
        lambda p: f"docs/images/bench-{p}",
        summary["machine"],
        summary["failed"],
    )
    publish(text, out, pictures)
    return 1 if summary["failed"] else 0


def _run_section(
    name: str, scale: Scale, out: Path, started: float, failed: dict[str, str]
) -> Section | None:
    """Measure one section and save its results; ``None`` (and a line in ``failed``) if it broke."""
    section_start = time.perf_counter()

    def progress(message: str) -> None:
        elapsed = time.perf_counter() - started
        print(f"[bench {elapsed:6.0f}s] {name}: {message}", file=sys.stderr, flush=True)

    progress("start")
    try:
        section = SECTIONS[name](scale, progress)
    except Exception as exc:  # noqa: BLE001 - one broken section must not hide the others
        failed[name] = "".join(traceback.format_exception_only(exc)).strip()
        progress(f"FAILED: {failed[name]}")
        if not isinstance(exc, BenchError):
            traceback.print_exc()
        return None
    section.seconds = time.perf_counter() - section_start
    (out / f"{name}.json").write_text(
        json.dumps(
            {
                "title": section.title,
                "scale": scale.name,
                "seconds": section.seconds,
                "rows": [dict(zip(HEADER, row.cells(), strict=True)) for row in section.rows],
                "notes": section.notes,
                "data": section.data,
            },
            indent=1,
        )
        + "\n"
    )
    progress(f"done in {section.seconds:.0f} s")
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="default")
    parser.add_argument(
        "--ten-million",
        action="store_true",
        default=os.environ.get("BENCH_TEN_MILLION", "") not in ("", "0"),
        help="also pump a 10M-line stream (or BENCH_TEN_MILLION=1)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--only", default="", help="comma-separated sections: " + ",".join(SECTIONS)
    )
    parser.add_argument("--publish", action="store_true", help="refresh docs/images and README")
    parser.add_argument(
        "--publish-from",
        type=Path,
        metavar="DIR",
        help="measure nothing: publish the results a finished run left in DIR",
    )
    args = parser.parse_args(argv)
    if args.publish_from:
        return publish_saved(args.publish_from)
    scale = SCALES[args.scale]
    if args.ten_million:
        scale = with_ten_million(scale)
    chosen = [s for s in args.only.split(",") if s] or list(SECTIONS)
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    done: list[Section] = []
    failed: dict[str, str] = {}
    for name in chosen:
        section = _run_section(name, scale, out, started, failed)
        if section is not None:
            done.append(section)

    from benchmarks.plots import PICTURES  # matplotlib only once something is to be drawn

    by_name = {s.name: s for s in done}
    pictures = []
    for picture, (source, draw) in PICTURES.items():
        if source in by_name:
            draw(by_name[source].data, out / picture)
            pictures.append(picture)
    seconds = time.perf_counter() - started
    machine = machine_line(scale, seconds, (load_start, os.getloadavg()[0]))
    text = markdown(done, pictures, lambda p: p, machine, failed)
    (out / "scoreboard.md").write_text(text)
    (out / "summary.json").write_text(
        json.dumps(
            {
                "scale": scale.name,
                "shape_lines": list(scale.shape_lines),
                "seconds": seconds,
                "sections": [s.name for s in done],
                "failed": failed,
                "pictures": pictures,
                "section_seconds": {s.name: s.seconds for s in done},
                "machine": machine,
            },
            indent=1,
        )
        + "\n"
    )
    print(text)
    print(f"results in {out} ({seconds / 60:.1f} min)", file=sys.stderr)
    if args.publish:  # a failed section is published as failed, not left out silently
        readme_text = markdown(done, pictures, lambda p: f"docs/images/bench-{p}", machine, failed)
        publish(readme_text, out, pictures)
    if failed:
        for name, error in failed.items():
            print(f"bench: section {name} failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
