"""docs/cli.md says what each option takes: its statements match the parser's."""

from __future__ import annotations

import argparse
import re

from harness import ROOT
from pgtick import cli

UNITS = {"d": "day", "h": "hour", "m": "minute", "s": "second"}


def _ceiling(action: argparse.Action) -> re.Match[str] | None:
    """The ceiling a duration option names when given 100 years (None: not a duration
    option, or one that takes 100 years)."""
    try:
        action.type("36525d")  # type: ignore[misc,operator]
    except argparse.ArgumentTypeError as exc:
        return re.search(r"must be at most (\d+)([dhms])\b", str(exc))
    except Exception:
        return None
    return None


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    """pgtick's subcommands by name, as its parser holds them."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(commands.choices)


def _duration_ceilings() -> list[tuple[str, argparse.Action, re.Match[str]]]:
    """(command, option, ceiling) of every duration option whose ceiling is below 100 years."""
    found = []
    for name, sub in _subcommands().items():
        for action in sub._actions:
            if action.option_strings and action.type is not None and (ceiling := _ceiling(action)):
                found.append((name, action, ceiling))
    return found


def test_every_duration_option_with_a_ceiling_below_100_years_is_named_with_it() -> None:
    """docs/cli.md: "Durations are … at most 100 years (`--jitter` … 1 day, …)". An option whose
    ceiling is lower says so there, or a user reads 100 years and gets refused."""
    text = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    said = re.search(r"\*\*Durations\*\*.*?at most 100 years \((.*?)\)\.", text)
    assert said, "docs/cli.md no longer says how long a duration may be"
    clauses = said.group(1).split(", ")
    wrong = []
    for name, action, ceiling in _duration_ceilings():
        number, unit = int(ceiling.group(1)), UNITS[ceiling.group(2)]
        phrase = f"{number} {unit}{'' if number == 1 else 's'}"
        option = action.option_strings[0]
        clause = [c for c in clauses if re.search(rf"`(?:{name} )?{option}`", c)]
        if not clause or not clause[0].endswith(phrase):
            wrong.append(f"pgtick {name} {option}: at most {phrase}; docs/cli.md: {clause or 'nothing'}")
    assert not wrong, "\n".join(wrong)


def test_every_command_that_calls_sql_is_in_the_table_of_what_it_calls_with_its_role() -> None:
    """docs/cli.md, "What each command calls": a command missing there leaves a psql user
    without its SQL, and an operator without the role to grant; the role named there is the
    one the command's permission error names."""
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split("## What each command calls", 1)[1].split("\n## ", 1)[0]
    table: dict[str, list[tuple[str, str]]] = {}
    for cells in re.findall(r"^\| `pgtick ([^`]+)` \|.*\| `(jobs_\w+)` \|$", section, flags=re.MULTILINE):
        said, role = cells
        for name in said.split(" / "):
            table.setdefault(name.split()[0], []).append((said, role))
    without_sql = {"migrate", "dsn", "web"}  # the schema's owner; no call; docs/dashboard.md
    missing = sorted(set(_subcommands()) - without_sql - set(table))
    assert not missing, f"docs/cli.md says nothing of what these commands call: {missing}"
    wrong = []
    for name, rows in table.items():
        for said, role in rows:
            needed = cli._role_needed(argparse.Namespace(command=name, dry_run="--dry-run" in said))
            if needed is not None and needed != role:
                wrong.append(f"pgtick {said}: docs/cli.md says {role}, its permission error names {needed}")
    assert not wrong, "\n".join(wrong)


def test_every_duration_option_with_a_ceiling_below_100_years_says_it_in_its_help() -> None:
    """`pgtick define --help` is where a user looks first: an option refused past a day says
    "1d" there, as its error does."""
    silent = []
    for name, action, ceiling in _duration_ceilings():
        bound = ceiling.group(1) + ceiling.group(2)
        if not re.search(rf"\b{bound}\)", action.help or ""):
            silent.append(f"pgtick {name} {action.option_strings[0]}: at most {bound}; help: {action.help!r}")
    assert not silent, "\n".join(silent)
