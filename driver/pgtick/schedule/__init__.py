"""What a schedule means: occurrences of RRULE and cron text in an IANA zone.

* `zones` — the DST rules and policies (``dst_gap``, ``dst_repeat``, auto);
* `cron` — 5-field cron as cronie reads it; `rrule` — RFC 5545 rules via dateutil;
* `occurrences` — `parse_schedule` and `Schedule.occurrences`, used by everyone;
* `plan` — the anchor of a definition and what to materialize now;
* `preview` — ``pgtick preview`` output.

Pure Python, no database access.
"""

from __future__ import annotations

from pgtick.schedule.occurrences import Occurrence, Schedule, looks_like_cron, parse_schedule
from pgtick.schedule.plan import MISFIRE_POLICIES, Plan, anchor_for, first_cursor, plan_materialization
from pgtick.schedule.preview import format_preview, header, preview
from pgtick.schedule.zones import DST_GAPS, DST_REPEATS, DstPolicy, ScheduleError, auto_policy

__all__ = [
    "DST_GAPS",
    "DST_REPEATS",
    "MISFIRE_POLICIES",
    "DstPolicy",
    "Occurrence",
    "Plan",
    "Schedule",
    "ScheduleError",
    "anchor_for",
    "auto_policy",
    "first_cursor",
    "format_preview",
    "header",
    "looks_like_cron",
    "parse_schedule",
    "plan_materialization",
    "preview",
]
