"""The shipped contract (``mapper_state.testing``) fails a store that breaks it.

A sound SQLite store and two broken variants (``tests/fixtures/bad-stores``): one whose
versions restart at 1 after a delete, one whose create overwrites. The contract runs on
them in a pytest of its own, from a directory outside the checkout, importing only the
installed package: exactly what a store's author runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from tests.helpers import clean_env

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def outcomes(report: Path) -> dict[str, dict[str, set[str]]]:
    """``{class: {"passed"|"failed": {test names}}}`` from a JUnit XML report."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for case in ET.parse(report).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            kind = "failed"
        else:
            kind = "skipped" if case.find("skipped") is not None else "passed"
        found[case.attrib["classname"].rsplit(".", 1)[1]][kind].add(case.attrib["name"])
    return found


def test_the_contract_fails_a_store_whose_versions_repeat_or_whose_create_overwrites(
    tmp_path: Path,
) -> None:
    work = tmp_path / "author"
    shutil.copytree(FIXTURES / "bad-stores", work)
    report = tmp_path / "report.xml"
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q"]
    options = ["-c", "/dev/null", "--rootdir", str(work), f"--junitxml={report}"]
    run = subprocess.run(
        # the 8 s renewal test proves nothing more here
        [*pytest, *options, "-k", "not renewal_keeps", "contract_on_bad_stores.py"],
        cwd=work,
        env=clean_env(PYTHONPATH=f"{FIXTURES / 'sqlite-store'}:{work}"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    found = outcomes(report)
    assert not found["TestSound"]["failed"], run.stdout
    assert len(found["TestSound"]["passed"]) >= 25
    # the sound store checks no deadline itself (written to the interface as documented
    # before the registry kept the deadline): the contract's check still passes
    assert "test_a_call_whose_deadline_has_passed_sends_nothing" in found["TestSound"]["passed"]
    assert found["TestRestartingVersions"]["failed"] == {
        "test_a_version_never_repeats_after_a_delete",
        "test_a_stalled_holder_cannot_renew_a_lease_created_after_its_own",
    }, run.stdout
    assert {
        "test_create_refuses_existing",
        "test_racing_creates_have_one_winner",
        "test_acquire_is_exclusive_and_names_the_holder",
        "test_state_write_is_conditional_on_the_version_seen",
    } <= found["TestOverwritingCreate"]["failed"], run.stdout
