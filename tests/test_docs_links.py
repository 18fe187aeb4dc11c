"""The README and the docs pages link to files that exist, and to headings those files have
(GitHub's anchors: lower case, punctuation dropped, spaces as dashes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "deploy" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    heads = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def local_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_local_links_resolve(page):
    broken = []
    for target in local_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert not broken, broken


def test_the_readme_links_every_docs_page():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in local_links(REPO / "README.md")}
    assert set(PAGES[2:]) <= linked, sorted(str(p) for p in set(PAGES[2:]) - linked)


def test_the_finder_sees_a_broken_link(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n[ok](#top) [bad](b.md) [web](https://x.org)\n")
    assert local_links(tmp_path / "a.md") == ["#top", "b.md"]
    assert anchors(tmp_path / "a.md") == {"top"}
