"""The README's Layout names every module of the driver and every file of sql/: a reader
finds where a thing lives from it, without a search."""

from __future__ import annotations

import re

from harness import ROOT


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"^## Layout\n\n```\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    assert found, "the README has no Layout block"
    return found.group(1)


def test_the_layout_names_every_driver_module_and_sql_file() -> None:
    layout = _layout()
    driver = ROOT / "driver" / "pgtick"
    files = [
        # django/ is a Django app, named as one: its modules are the ones Django looks for
        *(p for p in driver.rglob("*.py") if p.name != "__init__.py" and "django" not in p.parts),
        *(ROOT / "sql").glob("*.sql"),
    ]
    missing = sorted(
        str(p.relative_to(ROOT)) for p in files if not re.search(rf"(?<![\w.]){re.escape(p.name)}\b", layout)
    )
    assert not missing, f"the README's Layout does not name: {', '.join(missing)}"
