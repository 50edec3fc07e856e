"""docs/dashboard.md, "Schema the pages use", names every jobs object the dashboard's
statements use: the list an operator reads to grant, audit or keep a schema change from
breaking the dashboard."""

from __future__ import annotations

import ast
import re

from harness import ROOT

WEB = ROOT / "driver" / "pgtick" / "web"


def _statement_names() -> dict[str, str]:
    """jobs.NAME in the web package's string constants (docstrings left out), each with the
    file that sends it; private helpers (`jobs._x`) and types are the functions' concern."""
    found: dict[str, str] = {}
    for path in sorted(WEB.glob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                for name in re.findall(r"\bjobs\.([a-z]\w*)", node.value):
                    found.setdefault(name, path.name)
    return found


def test_the_dashboard_doc_names_every_jobs_object_its_statements_use() -> None:
    text = (ROOT / "docs" / "dashboard.md").read_text()
    section = text.split("## Schema the pages use", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`jobs\.(\w+)", section))
    used = _statement_names()
    assert used, "found no jobs object in the dashboard's statements"
    named |= {"run_status"}  # a type the statements cast to
    missing = sorted(f"jobs.{name} ({where})" for name, where in used.items() if name not in named)
    assert not missing, f'docs/dashboard.md, "Schema the pages use", leaves out: {", ".join(missing)}'
