"""The README and docs/: short README, its first commands exact, every relative link alive.

Plain text checks (no TensorFlow of their own): they read README.md and docs/*.md.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))

SETUP = ("python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && "
         ".venv/bin/python -m trainer")
TESTS = ".venv/bin/python -m pytest"

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code, where a [x](y) is not a link."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    found: set[str] = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def _relative_links(path: Path) -> list[str]:
    return [target for target in LINK.findall(_prose(path.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto:


def test_the_readme_fits_on_a_screen_or_two():
    assert len(README.read_text().splitlines()) <= 200


def test_the_readmes_first_two_code_blocks_are_setup_and_tests():
    blocks = [block.strip() for block in FENCE.findall(README.read_text())]
    assert blocks[:2] == [SETUP, TESTS]


def test_every_relative_link_points_into_the_repository():
    broken = []
    for page in [README, *DOCS]:
        for target in _relative_links(page):
            file, _, anchor = target.partition("#")
            resolved = (page.parent / file).resolve() if file else page
            if not resolved.exists() or REPO not in [resolved, *resolved.parents]:
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_the_readme_links_every_docs_page():
    linked = {(REPO / target.partition("#")[0]).resolve()
              for target in _relative_links(README)}
    assert DOCS and [page.name for page in DOCS if page not in linked] == []


def test_no_reference_to_files_outside_the_repository():
    code = [path for folder in ("trainer", "scripts", "conf")
            for path in (REPO / folder).rglob("*") if path.suffix in (".py", ".yaml", ".md")]
    texts = {path: path.read_text() for path in [README, *DOCS, *code]}
    assert [str(p.relative_to(REPO)) for p, text in texts.items()
            if "PERF_NOTES" in text or "DESIGN.md" in text or "../shared" in text] == []
