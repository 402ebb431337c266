"""The reference docs stay true: every setting, exit code and store is in them.

``docs/settings.md`` is generated from the declarations (``scripts/gen-reference.py``);
the other pages are written by hand, and these tests fail when code moves on without
them: a setting, an exit code or a built-in store missing from its page, a stale
generated page, a link to a file that does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mapper_state.config import catalog
from mapper_state.errors import ExitCode
from mapper_state.stores import BUILTIN, store_types
from tests.generated import assert_fresh

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REPO_URL = "https://github.com/mapper-state/mapper-state/"
PAGES = (
    "install.md",
    "pipelines.md",
    "meltano.md",
    "container.md",
    "settings.md",
    "exit-codes.md",
    "stores.md",
    "operations.md",
    "how-it-works.md",
    "reliability.md",
    "performance.md",
)


def test_the_settings_page_is_generated_from_todays_declarations() -> None:
    assert_fresh(DOCS / "settings.md")


@pytest.mark.parametrize("spec", catalog(), ids=lambda s: s.name)
def test_every_setting_is_documented(spec) -> None:  # type: ignore[no-untyped-def]
    text = (DOCS / "settings.md").read_text()
    row = next((line for line in text.splitlines() if line.startswith(f"| `{spec.name}` |")), None)
    assert row is not None, f"{spec.name} is missing from docs/settings.md"
    assert f"`{spec.env_var}`" in row
    assert spec.description.replace("|", "\\|") in row
    assert ("**secret**" in row) is spec.secret


def exit_code_rows() -> dict[int, str]:
    rows = {}
    for line in (DOCS / "exit-codes.md").read_text().splitlines():
        m = re.match(r"\| (\d+) \|", line)
        if m:
            rows[int(m.group(1))] = line
    return rows


@pytest.mark.parametrize("code", list(ExitCode), ids=lambda c: f"{c.value}-{c.name}")
def test_every_exit_code_is_documented(code: ExitCode) -> None:
    rows = exit_code_rows()
    assert code.value in rows, (
        f"exit code {code.value} ({code.name}) is missing from docs/exit-codes.md"
    )
    assert f"`{code.name}`" in rows[code.value]


def test_signal_exit_codes_are_documented() -> None:
    rows = exit_code_rows()
    assert 143 in rows  # SIGTERM, what a container runtime sends
    assert "128+N" in (DOCS / "exit-codes.md").read_text()


def test_no_exit_code_is_documented_that_does_not_exist() -> None:
    known = {c.value for c in ExitCode} | {143}
    assert set(exit_code_rows()) <= known


def test_every_builtin_store_has_notes() -> None:
    text = (DOCS / "stores.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert len(store_types()) >= len(BUILTIN)
    for store in store_types()[: len(BUILTIN)]:
        for scheme in store.schemes:
            assert f"`{scheme}://" in text, f"{scheme}:// is missing from docs/stores.md"
        assert any(f"`{store.schemes[0]}://`" in h for h in headings), (
            f"docs/stores.md has no section for {store.schemes[0]}://"
        )


def test_the_readme_is_the_front_page_and_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    for command in ("make demo", "make test"):
        assert command in readme
    for page in PAGES:
        assert f"](docs/{page})" in readme, page  # relative: any checkout, any forge
    # the front page, plus the scoreboard's published table (between its markers)
    start, end = readme.index("<!-- scoreboard:start -->"), readme.index("<!-- scoreboard:end -->")
    front = readme[:start] + readme[end:]
    assert len(front.splitlines()) < 200, "the reference belongs in docs/, not the README"


def _links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", path.read_text())


@pytest.mark.parametrize(
    "page",
    [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "SECURITY.md",
        ROOT / "CHANGELOG.md",
        *sorted(DOCS.glob("*.md")),
    ],
    ids=lambda p: p.name,
)
def test_links_point_at_files_that_exist(page: Path) -> None:
    for link in _links(page):
        target = link.split("#", 1)[0]
        if target.startswith(REPO_URL):
            kind, _, rest = target[len(REPO_URL) :].partition("/main/")
            if kind in ("blob", "tree"):
                assert (ROOT / rest).exists(), f"{page.name}: {link}"
            continue
        if re.match(r"[a-z]+:", target) or not target:
            continue
        assert (page.parent / target).exists(), f"{page.name}: {link}"


def test_the_docs_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    for page in sorted(DOCS.glob("*.md")):
        if page.name != "README.md":
            assert f"]({page.name})" in index, page.name
