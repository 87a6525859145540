"""Code that explains itself with a measurement names the bench/README.md section holding the figures
(``bench/README.md, "Heading"``) rather than copying them: every such name must be a heading there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = re.compile(r'bench/README(?:\.md)?,? "([^"]+)"')


def headings() -> list[str]:
    lines = (ROOT / "bench" / "README.md").read_text().splitlines()
    return [line.lstrip("#").strip() for line in lines if line.startswith("#")]


def references() -> list[tuple[str, str]]:
    found = []
    for tree in ("greyrelease", "e2e", "bench"):
        for path in sorted((ROOT / tree).rglob("*.py")):
            # A reference may be wrapped over comment or docstring lines: read it as one line.
            text = re.sub(r"\s*\n\s*(?:#:?\s*)?", " ", path.read_text())
            found += [(str(path.relative_to(ROOT)), name) for name in REFERENCE.findall(text)]
    return found


def test_the_code_names_sections_that_exist() -> None:
    names = headings()
    refs = references()
    assert len(refs) >= 10, refs  # the references the code makes (a reader that finds none is broken)
    missing = [(where, name) for where, name in refs if not any(h.startswith(name) for h in names)]
    assert not missing, f"bench/README.md has no heading for: {missing}"
