"""Docs are tested like code: internal links resolve, every error class is in troubleshooting."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from distinit import errors

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_internal_links_resolve(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.exists(), f"{page.name} links to missing {target}"


def test_every_error_class_is_in_troubleshooting() -> None:
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    names = [n for n, obj in vars(errors).items() if inspect.isclass(obj) and issubclass(obj, errors.DistinitError)]
    missing = [name for name in names if name not in text and name != "DistinitError"]
    assert not missing, f"docs/troubleshooting.md does not mention {missing}"


def test_every_capability_has_a_guide_linked_from_the_index() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    for page in ("env.md", "init.md", "testing.md", "watchdog.md", "broadcast.md", "troubleshooting.md"):
        assert (ROOT / "docs" / page).exists(), page
        assert f"({page})" in index, f"docs/index.md does not link {page}"
