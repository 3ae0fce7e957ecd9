"""The test tree itself: pytest imports test modules by their file name (the folders are not
packages), so two test files with one name make the whole run stop at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_test_module_names_are_unique():
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py" and "__pycache__" not in p.parts)
    repeated = sorted(name for name, count in names.items() if count > 1)
    assert not repeated, f"test modules share a file name (rename one of each): {repeated}"
