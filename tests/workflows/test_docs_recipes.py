"""The recipes docs/workflows.md shows are the ones ``recipes.py`` defines, word for word,
so the parity tests that run ``recipes.py`` on every engine run what the docs show (the
docs test runs the page's own copy)."""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOC = HERE.parents[1] / "docs" / "workflows.md"
REGION = re.compile(r"^# --- recipe: (.+?)\n(.*?)\n+# --- end$", re.S | re.M)


def regions() -> dict[str, str]:
    return {m[1]: m[2].strip() + "\n" for m in REGION.finditer((HERE / "recipes.py").read_text())}


def test_the_three_recipes_are_marked() -> None:
    assert sorted(regions()) == ["import", "payment", "sign-up"]


def test_each_recipe_is_on_the_docs_page_as_written() -> None:
    doc = DOC.read_text(encoding="utf-8")
    for name, code in regions().items():
        assert code in doc, f"the {name} recipe in recipes.py differs from docs/workflows.md"
