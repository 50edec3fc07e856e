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


def test_every_duration_option_with_a_ceiling_below_100_years_is_named_with_it() -> None:
    """docs/cli.md: "Durations are … at most 100 years (`--jitter` … 1 day, …)". An option whose
    ceiling is lower says so there, or a user reads 100 years and gets refused."""
    text = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    said = re.search(r"\*\*Durations\*\*.*?at most 100 years \((.*?)\)\.", text)
    assert said, "docs/cli.md no longer says how long a duration may be"
    clauses = said.group(1).split(", ")
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    wrong = []
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if not action.option_strings or action.type is None:
                continue
            ceiling = _ceiling(action)
            if ceiling is None:
                continue
            number, unit = int(ceiling.group(1)), UNITS[ceiling.group(2)]
            phrase = f"{number} {unit}{'' if number == 1 else 's'}"
            option = action.option_strings[0]
            clause = [c for c in clauses if re.search(rf"`(?:{name} )?{option}`", c)]
            if not clause or not clause[0].endswith(phrase):
                wrong.append(f"pgtick {name} {option}: at most {phrase}; docs/cli.md: {clause or 'nothing'}")
    assert not wrong, "\n".join(wrong)
