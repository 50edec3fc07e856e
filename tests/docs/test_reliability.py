"""docs/reliability.md describes the chaos soak: the families of bad values and changes it
injects by default are the ones tests/chaos/test_soak.py injects."""

from __future__ import annotations

import re

from harness import ROOT


def test_the_soak_families_the_doc_names_are_the_ones_the_soak_injects_by_default() -> None:
    doc = (ROOT / "docs" / "reliability.md").read_text()
    soak = (ROOT / "tests" / "chaos" / "test_soak.py").read_text()
    injected = re.search(r'"PGTICK_SOAK_FAMILIES", "([\w,]+)"', soak)
    assert injected, "tests/chaos/test_soak.py no longer reads PGTICK_SOAK_FAMILIES with a default"
    documented = re.search(r"PGTICK_SOAK_FAMILIES`.*?\(default `([\w,]+)`\)", doc, flags=re.DOTALL)
    assert documented, "docs/reliability.md no longer gives the default of PGTICK_SOAK_FAMILIES"
    assert documented.group(1).split(",") == injected.group(1).split(","), (
        f"docs/reliability.md says the soak injects {documented.group(1)} by default,"
        f" tests/chaos/test_soak.py injects {injected.group(1)}"
    )
    count = re.search(r"Alongside them, (\w+) families of bad values and changes", doc)
    words = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
    assert count and words.get(count.group(1)) == len(injected.group(1).split(",")), (
        f"docs/reliability.md counts {count.group(1) if count else 'no'} families;"
        f" the soak injects {injected.group(1)}"
    )
