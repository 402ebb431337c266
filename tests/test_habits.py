"""The project's habits stay in step with what they describe.

The pre-commit hooks run exactly ``make lint``'s commands; the forge's CI workflow runs
``.ci/run`` and nothing else; the changelog keeps its Unreleased section; the mutation
study still applies to the code.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def make_lint_commands() -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = lines.index("lint: setup") + 1
    commands = []
    for line in lines[start:]:
        if not line.startswith("\t"):
            break
        commands.append(line.strip().replace("$(BIN)", ".venv/bin"))
    return commands


def test_pre_commit_runs_the_same_checks_as_make_lint() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    (repo,) = config["repos"]
    assert repo["repo"] == "local"
    hooks = repo["hooks"]
    assert all(h["language"] == "system" and h["pass_filenames"] is False for h in hooks)
    assert [h["entry"] for h in hooks] == make_lint_commands()


def test_the_ci_workflow_runs_ci_run_and_nothing_else() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    (job,) = workflow["jobs"].values()
    steps = job["steps"]
    assert [s.get("uses", "").split("@")[0] for s in steps[:1]] == ["actions/checkout"]
    assert [s.get("run") for s in steps[1:]] == ["bash .ci/run"]


def test_the_changelog_keeps_an_unreleased_section() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "[Keep a Changelog]" in text
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[0] == "[Unreleased]"
    for section in re.findall(r"^### (.+)$", text, flags=re.M):
        assert section in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_contributing_says_how_to_work_here() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    for needed in ("make demo", "make test", "make lint", "StoreContract", "make bench"):
        assert needed in text, needed


def test_every_mutant_of_the_mutation_study_still_finds_its_line() -> None:
    """``make mutants`` runs outside ``make test``: a safety line that moved would leave its
    mutant unable to apply, and the study unable to run, until someone ran it. Each
    mutant's snippet must be found exactly once, and each test it names must exist."""
    listed = subprocess.run(
        [sys.executable, "scripts/mutants.py", "--list"],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stdout.decode() + listed.stderr.decode()
    named = re.findall(r"(tests/\S+\.py)::(\w+)", listed.stdout.decode())
    assert named, listed.stdout
    for path, test in named:
        found = re.search(rf"^\s*(def|class) {test}\b", (ROOT / path).read_text(), re.M)
        assert found, f"{path}::{test} is gone"
