"""The README and docs/ name SQL objects and arguments that exist: a user who copies
`jobs.retry_many(run_ids => ...)` or `jobs.prune(older_than => ...)` from them gets a call
PostgreSQL accepts."""

from __future__ import annotations

import re

from harness import ROOT, Conn

#: Pages about the product's SQL surface (performance.md and scaling.md are measurements).
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in ("performance.md", "scaling.md")),
]

#: Names the docs give as examples of a pattern, not as objects that exist.
EXAMPLES = {"run_history_20261201"}

#: Words that stand for a value in a call, not for an argument's name.
VALUES = {"now", "true", "false", "null", "id"}


def _functions(conn: Conn) -> dict[str, list[set[str]]]:
    found: dict[str, list[set[str]]] = {}
    for name, args in conn.execute(
        "SELECT p.proname, coalesce(p.proargnames, '{}') FROM pg_proc AS p"
        " JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = 'jobs'"
    ):
        found.setdefault(name, []).append(set(args))
    return found


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def test_every_jobs_object_the_docs_name_exists(conn: Conn) -> None:
    names = (
        {
            r[0]
            for r in conn.execute(
                "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'jobs'"
                " UNION SELECT t.typname FROM pg_type AS t JOIN pg_namespace AS n ON n.oid = t.typnamespace"
                " WHERE n.nspname = 'jobs'"
            )
        }
        | set(_functions(conn))
        | EXAMPLES
    )
    missing = [
        f"{doc.relative_to(ROOT)}:{_line(text, m.start())}: jobs.{m.group(1)}"
        for doc in DOCS
        for text in [doc.read_text()]
        for m in re.finditer(r"\bjobs\.(\w+)", text)
        if m.group(1) not in names
    ]
    assert not missing, "the docs name jobs objects the schema does not have:\n" + "\n".join(missing)


def test_every_column_the_docs_name_as_jobs_relation_column_exists(conn: Conn) -> None:
    """`jobs.definition_health.lateness_p99`, `jobs.backfills.error`: a column a reader is told
    to look at is there."""
    columns: dict[str, set[str]] = {}
    for relation, column in conn.execute(
        "SELECT c.relname, a.attname FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid"
        " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'jobs' AND a.attnum > 0 AND NOT a.attisdropped"
    ):
        columns.setdefault(relation, set()).add(column)
    missing = [
        f"{doc.relative_to(ROOT)}:{_line(text, m.start())}: jobs.{m.group(1)}.{m.group(2)}"
        for doc in DOCS
        for text in [doc.read_text()]
        for m in re.finditer(r"\bjobs\.(\w+)\.(\w+)", text)
        if m.group(1) in columns and m.group(2) not in columns[m.group(1)]
    ]
    assert not missing, "the docs name columns the schema does not have:\n" + "\n".join(missing)


def test_every_argument_the_docs_give_a_jobs_function_is_one_of_its_arguments(conn: Conn) -> None:
    """Named notation (`jobs.define(..., timezone => ...)`) and a signature written out
    (`jobs.retry_many(run_ids)`, `jobs.heartbeat(run_ids bigint[], worker)`) use the
    function's own argument names."""
    functions = _functions(conn)
    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"\bjobs\.(\w+)\(", text):
            if m.group(1) not in functions:
                continue
            depth, end = 1, m.end()
            while end < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            inner = text[m.end() : end - 1]
            given = set(re.findall(r"\b(\w+)\s*=>", inner))
            if not re.search(r"['\"(]", inner):  # a signature, not a call with values
                for part in inner.split(","):
                    words = re.sub(r"=>.*", "", part).split()
                    if words and re.fullmatch(r"[a-z_][a-z0-9_]*", words[0]) and words[0] not in VALUES:
                        given.add(words[0])
            for name in sorted(given):
                if not any(name in args for args in functions[m.group(1)]):
                    wrong.append(
                        f"{doc.relative_to(ROOT)}:{_line(text, m.start())}: jobs.{m.group(1)} has no"
                        f" argument {name!r} (it takes {sorted(set().union(*functions[m.group(1)]))})"
                    )
    assert not wrong, "\n".join(wrong)
