"""The house stays readable: rooms of one job (no module over ~450 lines), a README a
newcomer finishes, and documentation whose every link leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 450
MAX_README_LINES = 200
# Modules allowed past the limit, each with the reason it must be one room.
LONG_MODULES: dict[str, str] = {}
# The folders whose modules are held to the limit: the product, the benchmarks' scripts,
# and the tests (each folder searched to the bottom).
SOURCE_PACKAGES = ("app", "backends", "benchmarks", "tests")
# [text](target): the target up to the first space or closing parenthesis.
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def long_modules(root: Path, limit: int) -> dict[str, int]:
    """Every Python module under ``root``'s source folders longer than ``limit`` lines."""
    found: dict[str, int] = {}
    for package in SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            count = len(path.read_text(encoding="utf-8").splitlines())
            if count > limit:
                found[path.relative_to(root).as_posix()] = count
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links in a Markdown page whose file does not exist."""
    broken = []
    for target in _LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor in the page itself
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    return broken


def markdown_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_no_module_is_over_the_limit_but_the_named_exceptions() -> None:
    over = long_modules(REPO, MAX_MODULE_LINES)
    unexplained = {name: lines for name, lines in over.items() if name not in LONG_MODULES}
    assert not unexplained, (
        f"modules over {MAX_MODULE_LINES} lines: {unexplained}; split them along their seams "
        "(or name one in LONG_MODULES with the reason it must stay one room)"
    )


def test_the_named_exceptions_are_still_long() -> None:
    over = long_modules(REPO, MAX_MODULE_LINES)
    stale = [name for name in LONG_MODULES if name not in over]
    assert not stale, f"no longer over the limit, drop them from LONG_MODULES: {stale}"


def test_the_size_check_finds_a_long_module(tmp_path: Path) -> None:
    for folder in ("app", "benchmarks"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "short.py").write_text("x = 1\n" * 10)
        (tmp_path / folder / "long.py").write_text("x = 1\n" * 451)
    assert long_modules(tmp_path, MAX_MODULE_LINES) == {
        "app/long.py": 451,
        "benchmarks/long.py": 451,
    }


def test_the_readme_is_a_front_page() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md is {len(lines)} lines; keep it under {MAX_README_LINES} and move the "
        "rest to a page in docs/"
    )


def test_every_documentation_link_resolves() -> None:
    broken = {
        page.relative_to(REPO).as_posix(): links
        for page in markdown_pages()
        if (links := broken_links(page))
    }
    assert not broken, f"links to files that do not exist: {broken}"


def test_every_docs_page_is_reachable_from_the_readme_and_opens_with_a_paragraph() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in sorted((REPO / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        linked = f"docs/{page.name}" in readme or any(
            f"]({page.name}" in other.read_text(encoding="utf-8")
            for other in (REPO / "docs").glob("*.md")
            if other != page
        )
        assert linked, f"docs/{page.name} is linked from neither the README nor another page"
        title, _, rest = text.partition("\n\n")
        assert title.startswith("# "), f"docs/{page.name} opens without a title"
        assert rest and not rest.startswith("#"), f"docs/{page.name} has no opening paragraph"


def test_the_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# There\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [web](https://example.com) [anchor](#top) [gone](missing.md#part)\n"
    )
    assert broken_links(page) == ["missing.md#part"]
