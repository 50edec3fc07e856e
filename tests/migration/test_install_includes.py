"""sql/install.sql is the one record of load order: every schema file is in it exactly once."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from harness import Database, Server, psql_file
from pgtick import migrate

_INCLUDE = re.compile(r"^(?:\\set\s+migration\s+(\S+)\s+)?\\ir\s+(\S+)\s*$")


def included(root: Path) -> Counter[Path]:
    """Every file install.sql loads (a migration line counts its NNNN_name.sql too), with counts."""
    counts: Counter[Path] = Counter()
    appliers: set[Path] = set()
    sql_dir = root / "sql"
    for line in (sql_dir / "install.sql").read_text().splitlines():
        match = _INCLUDE.match(line)
        if match is None:
            continue
        migration, target = match.groups()
        path = (sql_dir / target).resolve()
        if migration:
            counts[(path.parent / f"{migration}.sql").resolve()] += 1
            appliers.add(path)
        else:
            counts[path] += 1
    for path in appliers:  # the shared apply.sql, once however many migrations use it
        counts[path] += 1
    return counts


def problems(root: Path) -> list[str]:
    on_disk = {p.resolve() for d in ("sql", "migrations") for p in (root / d).glob("*.sql")}
    on_disk.discard((root / "sql" / "install.sql").resolve())
    counts = included(root)
    out = [f"not in sql/install.sql: {p.name}" for p in sorted(on_disk - counts.keys())]
    out += [f"included {n} times: {p.name}" for p, n in sorted(counts.items()) if n != 1]
    out += [f"included but missing: {p.name}" for p in sorted(counts.keys() - on_disk)]
    return out


def copy_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(migrate.schema_root() / "sql", root / "sql")
    shutil.copytree(migrate.schema_root() / "migrations", root / "migrations")
    return root


def add_migration_line(root: Path, migration: str) -> None:
    install = root / "sql" / "install.sql"
    text = install.read_text()
    last = max(m.end() for m in re.finditer(r"^\\set migration .*$", text, re.M))
    install.write_text(
        text[:last] + f"\n\\set migration {migration} \\ir ../migrations/apply.sql" + text[last:]
    )


def test_every_schema_file_is_included_exactly_once() -> None:
    assert problems(migrate.schema_root()) == []


def test_driver_plan_follows_the_includes() -> None:
    root = migrate.schema_root()
    plan = migrate.install_plan(root)
    counts = included(root)
    listed = [p.resolve() for p in [plan.bootstrap, *(m.path for m in plan.migrations), *plan.function_files]]
    assert set(listed) == counts.keys() - {(root / "migrations" / "apply.sql").resolve()}
    assert plan.function_files[-1].name == "roles.sql"
    assert [m.version for m in plan.migrations] == sorted(m.version for m in plan.migrations)


def test_a_new_file_not_listed_is_caught(tmp_path: Path) -> None:
    root = copy_root(tmp_path)
    (root / "migrations" / "9998_extra.sql").write_text("SELECT 1;\n")
    (root / "sql" / "extra.sql").write_text("SELECT 1;\n")
    assert problems(root) == ["not in sql/install.sql: 9998_extra.sql", "not in sql/install.sql: extra.sql"]


def test_an_unknown_include_is_refused(tmp_path: Path) -> None:
    root = copy_root(tmp_path)
    install = root / "sql" / "install.sql"
    install.write_text(install.read_text().replace("\\ir roles.sql", "\\ir nowhere.sql\n\\ir roles.sql"))
    with pytest.raises(migrate.SchemaFilesMissing, match=r"nowhere\.sql"):
        migrate.install_plan(root)


def test_a_new_migration_is_one_line_for_both_paths(pg: Server, tmp_path: Path) -> None:
    """A migrations/NNNN file plus its one install.sql line is applied once by psql and by the driver."""
    root = copy_root(tmp_path)
    (root / "migrations" / "9998_extra.sql").write_text(
        "CREATE TABLE jobs.extra (id int);\nCOMMENT ON TABLE jobs.extra IS 'extra';\n"
    )
    add_migration_line(root, "9998_extra")
    assert problems(root) == []
    empty, empty2 = pg.create_empty_database(), pg.create_empty_database()
    try:
        _install_both_ways(empty, empty2, root)
    finally:
        pg.drop_database(empty)
        pg.drop_database(empty2)


def _install_both_ways(empty: Database, empty2: Database, root: Path) -> None:
    with psycopg.connect(empty.dsn, autocommit=True) as conn:
        assert migrate.apply(conn, root)[-1] == "9998"
        assert migrate.apply(conn, root) == []
    for _ in range(2):
        result = psql_file(empty2.dsn, root / "sql" / "install.sql")
        assert result.returncode == 0, result.stderr
    for dsn in (empty.dsn, empty2.dsn):
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT version, name FROM jobs.schema_migrations WHERE version = '9998'"
            ).fetchall()
            assert rows == [("9998", "extra")]
            assert conn.execute("SELECT to_regclass('jobs.extra')::text").fetchone() == ("jobs.extra",)
