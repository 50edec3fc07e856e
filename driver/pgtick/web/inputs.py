"""Validation of what the browser sends, with the SQL API's wording and SQLSTATEs."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pgtick.client import read_time
from pgtick.errors import InvalidArgument
from pgtick.schedule.zones import not_a_place
from pgtick.terminal import HIDDEN_CHARACTERS
from pgtick.web.queries import STATUSES, RunFilter


class BadInput(InvalidArgument):
    """A field the browser sent is invalid (an ``InvalidArgument``: SQLSTATE 22023, a
    ``ValueError``); shown with HTTP 400."""


def text(
    params: Mapping[str, str],
    field: str,
    *,
    max_length: int = 200,
    required: bool = False,
    exact: bool = False,
) -> str | None:
    """A text field, stripped of surrounding spaces; ``exact`` for a name, taken as sent:
    "nightly" and "nightly " are two definitions. Blank is None (or refused when required)."""
    raw = params.get(field) or ""
    value = raw if exact else raw.strip()
    if not value.strip():
        if required:
            raise BadInput(f"{field} must be a non-empty text")
        return None
    if len(value) > max_length:
        raise BadInput(f"{field} is {len(value)} characters long; the limit is {max_length}")
    if "\x00" in value:
        raise BadInput(f"{field} must not contain a NUL character")
    return value


def name(params: Mapping[str, str], field: str, *, max_length: int = 200) -> str:
    """A required name shown in logs and pages (an operator's): a text without control
    characters or characters that hide or turn text around, as the SQL API takes names."""
    value = text(params, field, max_length=max_length, required=True)
    assert value is not None
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cs") or c in HIDDEN_CHARACTERS), None)
    if bad is not None:
        raise BadInput(
            f"{field} must not contain control, invisible or text-direction characters (U+{ord(bad):04X})"
        )
    return value


def integer(
    params: Mapping[str, str], field: str, low: int, high: int, *, default: int | None = None
) -> int | None:
    raw = (params.get(field) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"{field} must be an integer, got {raw[:40]!r}") from None
    if not low <= value <= high:
        raise BadInput(f"{field} must be between {low} and {high}, got {value}")
    return value


def choice(params: Mapping[str, str], field: str, allowed: Sequence[str]) -> str | None:
    """One of `allowed`, or None for blank or ``auto`` (a DST policy left to auto)."""
    value = text(params, field, max_length=20)
    if value is None or value == "auto":
        return None
    if value not in allowed:
        raise BadInput(f"{field} must be {', '.join(allowed[:-1])} or {allowed[-1]} (or auto), got {value!r}")
    return value


def instant(params: Mapping[str, str], field: str, zone: str = "UTC") -> datetime | None:
    """An ISO 8601 time; without an offset it is read in `zone` as every other path reads a
    wall time (``pgtick.client.read_time``: a skipped time shifted, a repeated one the first)."""
    raw = (params.get(field) or "").strip()
    if not raw:
        return None
    if len(raw) > 64:  # ISO 8601 with nanoseconds and an offset is shorter; fromisoformat takes any digits
        raise BadInput(f"{field} must be an ISO 8601 time such as 2026-03-29T09:00, got {raw[:40]!r}...")
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
    except ValueError:
        raise BadInput(
            f"{field} must be an ISO 8601 time such as 2026-03-29T09:00, got {raw[:40]!r}"
        ) from None
    try:
        value = read_time(parsed, zone, field_name=field)
    except InvalidArgument as exc:
        raise BadInput(str(exc)) from None
    if not datetime(1, 1, 2, tzinfo=UTC) < value < datetime(9999, 12, 30, tzinfo=UTC):
        raise BadInput(f"{field} must be a finite timestamp, got {raw[:40]!r}")
    return value


def zone(params: Mapping[str, str], field: str) -> str:
    name = text(params, field, max_length=100) or "UTC"
    why = not_a_place(name)
    if why is not None:  # as a definition refuses it
        raise BadInput(f"timezone {why}")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise BadInput(f"timezone {name!r} is not a known IANA time zone name") from None
    return name


def run_filter(params: Mapping[str, str]) -> RunFilter:
    status = text(params, "status", max_length=20)
    if status is not None:
        status = status.upper()
        if status not in STATUSES:
            raise BadInput(f"status must be one of {', '.join(STATUSES)}, got {status[:20]!r}")
    since = instant(params, "since")
    until = instant(params, "until")
    if since is not None and until is not None and until <= since:
        raise BadInput("until must be later than since")
    return RunFilter(
        status=status,
        kind=text(params, "kind", exact=True),
        queue=text(params, "queue", exact=True),
        definition=text(params, "definition", exact=True),
        since=since,
        until=until,
    )


def local_path(value: str | None, default: str) -> str:
    """A redirect target inside this site ("/runs?status=FAILED"), else `default`."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return default
    if any(ord(c) < 32 for c in value):
        return default
    return value
