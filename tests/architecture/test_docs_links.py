"""The docs as a set of pages: every relative link of README.md and docs/**/*.md points to a file
that exists and, where it names an anchor, to a heading of that file (GitHub's anchors)."""

import re

from tests.helpers.cli import REPO

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page):
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'
    (a repeated heading gets -1, -2, ...)."""
    found, seen = set(), {}
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        count = seen.get(slug, 0)
        found.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return found


def pages():
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_every_relative_link_resolves():
    broken = []
    for page in pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
