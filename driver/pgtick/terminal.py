"""How the command line shows things to a person: tables that fit, status marks, times.

Everything here is presentation: the facts come from SQL views and functions
(``sql/console.sql``, ``sql/ops.sql``). Rules:

* a table fits ``width`` columns (100 unless the terminal is narrower, down to
  ``MIN_WIDTH``): columns
  are dropped lowest priority first, long text is cut with an ellipsis; ``wide``
  shows every column at full length;
* times are shown in the definition's zone with its abbreviation, next to a
  relative form ("in 4m", "12s ago");
* a status is a mark (✓ ✗ ⟳ …) when the output can show UTF-8 and ``NO_COLOR``
  is unset, otherwise a letter; colour only when stdout is a terminal;
* ``PGTICK_NOW`` (ISO 8601) fixes the "now" used for display, for reproducible output.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TextIO
from zoneinfo import ZoneInfo

from rich.cells import cell_len

from pgtick import json_numbers
from pgtick.errors import UsageError
from pgtick.schedule.zones import strftime

# ---------------------------------------------------------------------------- style


#: The narrowest width output is laid out for: a terminal narrower still gets this many
#: columns (and wraps them), as a table cannot usefully be cut further.
MIN_WIDTH = 20


@dataclass(frozen=True)
class Style:
    """What the output stream can show: marks (UTF-8), colour (a terminal), its width, and
    whether it is a terminal (text kept as stored when piped is wrapped to fit one)."""

    unicode: bool
    colour: bool
    width: int
    encoding: str | None = None  # the output's encoding, when it is not UTF-8
    terminal: bool = False

    def shown(self, text: str) -> str:
        """``text`` as the output will write it: a character its encoding lacks is ``?``
        (what the stream substitutes), so that it is measured as it will be printed: a wide
        character then takes one column and a combining accent one of its own."""
        if self.encoding is None:
            return text
        try:
            return text.encode(self.encoding, "replace").decode(self.encoding, "replace")
        except LookupError:  # an encoding Python does not know: it could not be written either
            return text

    @property
    def ellipsis(self) -> str:
        """The mark of cut text: ``…``, or ``~`` where the output cannot write it."""
        return "…" if self.shown("…") == "…" else "~"

    @classmethod
    def detect(cls, stream: TextIO | None = None) -> Style:
        stream = stream or sys.stdout
        no_color = bool(os.environ.get("NO_COLOR"))  # set and not empty (no-color.org)
        tty = bool(getattr(stream, "isatty", lambda: False)())
        width = 100
        if tty:
            width = min(100, shutil.get_terminal_size((100, 40)).columns)
        return cls(
            unicode=utf8(stream) and not no_color,
            colour=redraws(stream) and not no_color,
            width=max(MIN_WIDTH, width),
            encoding=None if utf8(stream) else getattr(stream, "encoding", None),
            terminal=tty,
        )


def utf8(stream: TextIO) -> bool:
    """True when ``stream`` writes UTF-8 (what it cannot encode it would refuse)."""
    return (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "") == "utf8"


def redraws(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal that can move its cursor and clear its screen
    (a progress bar, a redrawn screen): not a pipe or a file, and not ``TERM=dumb`` (an
    Emacs shell buffer, for one), which would print the control codes as text."""
    return bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"


# Status -> (mark, plain letter, colour). SKIPPED is a CANCELLED run with failure_reason Skipped.
MARKS: dict[str, tuple[str, str, str]] = {
    "COMPLETED": ("✓", "C", "green"),
    "FAILED": ("✗", "F", "red"),
    "RUNNING": ("⟳", "R", "cyan"),
    "QUEUED": ("·", "Q", "dim"),
    "CANCELLED": ("⊘", "X", "yellow"),
    "SKIPPED": ("↷", "S", "yellow"),
}

_ANSI = {"green": "32", "red": "31", "cyan": "36", "yellow": "33", "dim": "2", "bold": "1"}


def paint(text: str, colour: str | None, style: Style) -> str:
    if not style.colour or not colour or not text:
        return text
    return f"\033[{_ANSI[colour]}m{text}\033[0m"


def mark(status: str | None, style: Style) -> str:
    """One character for a run status."""
    if status is None:
        return " "
    glyph, letter, colour = MARKS.get(status, ("?", "?", "dim"))
    return paint(glyph if style.unicode else letter, colour, style)


def status_word(status: str | None, style: Style) -> str:
    """Mark and word, e.g. ``✓ COMPLETED``."""
    if status is None:
        return ""
    return f"{mark(status, style)} {paint(status, MARKS.get(status, ('', '', 'dim'))[2], style)}"


def outcome_of(status: str, failure_reason: str | None) -> str:
    return "SKIPPED" if status == "CANCELLED" and failure_reason == "Skipped" else status


# ---------------------------------------------------------------------------- time


def display_now() -> datetime:
    """Now, for display only: ``PGTICK_NOW`` (ISO 8601) when set, else the clock."""
    fixed = os.environ.get("PGTICK_NOW")
    if fixed:
        try:
            value = datetime.fromisoformat(fixed)
        except ValueError:
            raise UsageError(
                f"PGTICK_NOW must be an ISO 8601 time such as 2026-11-30T12:00:00Z, got {fixed[:40]!r}"
            ) from None
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.now(UTC)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """A count and its noun in the number the count takes: ``1 run``, ``0 runs``, ``2 runs``
    (``plural`` where an added s is wrong: ``counted(2, "worker process", "worker processes")``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def compact_duration(value: timedelta | float | None) -> str:
    """45s, 2m30s, 1h05m, 3d4h; below ten seconds with one decimal (1.3s), below one in ms."""
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    seconds = max(seconds, 0.0)
    if 0 < seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    if seconds < 10 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" + (f"{s % 60:02d}s" if s % 60 else "")
    if s < 86400:
        return f"{s // 3600}h" + (f"{s % 3600 // 60:02d}m" if s % 3600 >= 60 else "")
    return f"{s // 86400}d" + (f"{s % 86400 // 3600}h" if s % 86400 >= 3600 else "")


def relative(when: datetime | None, now: datetime) -> str:
    """``in 4m`` or ``12s ago`` (``now`` within half a second)."""
    if when is None:
        return ""
    delta = (when - now).total_seconds()
    if abs(delta) < 0.5:
        return "now"
    text = compact_duration(timedelta(seconds=round(abs(delta))))
    return f"in {text}" if delta > 0 else f"{text} ago"


def local_time(when: datetime | None, zone: str | None, now: datetime) -> str:
    """A time in ``zone`` with the zone's abbreviation, as short as is unambiguous:
    ``14:05:09 EET`` today, ``Dec 02 09:00 EET`` another day, ``2027-01-05 09:00 EET``
    another year."""
    if when is None:
        return ""
    tz = ZoneInfo(zone or "UTC")
    local = when.astimezone(tz)
    today = now.astimezone(tz).date()
    if local.date() == today:
        text = local.strftime("%H:%M:%S")
    elif local.year == today.year:
        text = local.strftime("%b %d %H:%M")
    else:
        text = strftime(local, "%Y-%m-%d %H:%M")
    return f"{text} {local.tzname()}"


def full_time(when: datetime | None, zone: str | None) -> str:
    """``2026-11-29 03:00:14 EET``: a time in full, in ``zone``."""
    if when is None:
        return ""
    local = when.astimezone(ZoneInfo(zone or "UTC"))
    return strftime(local, "%Y-%m-%d %H:%M:%S ") + (local.tzname() or "")


def iso(when: datetime | None) -> str | None:
    """UTC ISO 8601 with a Z, for JSON and CSV."""
    if when is None:
        return None
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def seconds(value: timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


# ---------------------------------------------------------------------------- tables


@dataclass
class Column:
    """One table column: its header, how to get the cell text, how important it is."""

    header: str
    cell: Callable[[dict[str, Any]], str]
    priority: int = 4  # lower is more important; OPTIONAL and up go before any text is cut
    wide_only: bool = False
    shrink: bool = False  # may be cut with an ellipsis
    middle: bool = False  # cut in the middle: names that share a prefix stay apart
    min_width: int = 8
    right: bool = False
    colour: Callable[[dict[str, Any]], str | None] | None = None
    # Text after the cell's that a cut leaves whole (a queue's " (paused)"): the cell's own
    # text is cut to the room it leaves.
    suffix: Callable[[dict[str, Any]], str] | None = None


@dataclass
class Table:
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def render(self, style: Style, *, wide: bool = False) -> str:
        cols = [c for c in self.columns if wide or not c.wide_only]
        shown_rows = [written_out(r) for r in self.rows]  # once a row: a list may have 10000
        cells = [[style.shown(_one_line(c.cell(r))) for c in cols] for r in shown_rows]
        tails = [[style.shown(_one_line(c.suffix(r))) if c.suffix else "" for c in cols] for r in shown_rows]
        widths = [
            max(
                [
                    visible_len(c.header),
                    *(visible_len(row[i] + tail[i]) for row, tail in zip(cells, tails, strict=True)),
                ]
            )
            for i, c in enumerate(cols)
        ]
        keep = list(range(len(cols)))
        if not wide:
            keep, widths = _fit(cols, widths, style.width)
        lines = []
        header = "  ".join(_pad(cols[i].header, widths[i], cols[i].right) for i in keep)
        lines.append(paint(header.rstrip(), "bold", style))
        shown = [list(row) for row in cells]
        for i in keep:
            column = [row[i] for row in cells]
            ends = [tail[i] for tail in tails]
            room = [max(widths[i] - visible_len(end), 1) for end in ends]
            cut = [
                _cut(text, width, middle=cols[i].middle, marker=style.ellipsis)
                for text, width in zip(column, room, strict=True)
            ]
            if cols[i].middle:
                for width in set(room):  # each room apart: cells cut alike at the same width
                    at = [n for n, w in enumerate(room) if w == width]
                    again = _kept_apart([column[n] for n in at], [cut[n] for n in at], width, style.ellipsis)
                    for n, text in zip(at, again, strict=True):
                        cut[n] = text
            for row, text, end in zip(shown, cut, ends, strict=True):
                row[i] = text + end
        for r, row in zip(self.rows, shown, strict=True):
            parts = []
            for i in keep:
                text = row[i]
                # The last column left-aligned is not padded: a coloured cell's spaces would
                # sit inside its colour codes, past the rstrip below.
                last = i == keep[-1] and not cols[i].right
                padded = text if last else _pad(text, widths[i], cols[i].right)
                colour_of = cols[i].colour
                colour = colour_of(r) if colour_of is not None else None
                parts.append(paint(padded, colour, style) if colour else padded)
            lines.append("  ".join(parts).rstrip())
        return "\n".join(lines)


_ESCAPES = re.compile(r"\033\[[0-9;]*m")


def visible_len(text: str) -> int:
    """Columns the text takes on screen: a wide character (CJK, most emoji) takes two, a
    combining mark none, and colour codes none."""
    return cell_len(_ESCAPES.sub("", text))


def _clusters(text: str) -> list[str]:
    """``text`` as the units a cut must keep whole: a character with the combining marks
    (and other zero-width characters) after it, emoji joined by a zero-width joiner, and the
    two regional indicators of a flag (one alone is drawn as a box of its own)."""
    out: list[str] = []
    for ch in text:
        if out and (cell_len(ch) == 0 or out[-1].endswith("\u200d") or _second_of_flag(out[-1], ch)):
            out[-1] += ch
        else:
            out.append(ch)
    return out


def _regional(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"


def _second_of_flag(before: str, ch: str) -> bool:
    """``ch`` completes a flag: a regional indicator after a lone one."""
    return _regional(ch) and len(before) == 1 and _regional(before)


def _head(parts: Sequence[str], width: int) -> list[str]:
    """The leading clusters of ``parts`` that fit ``width`` columns."""
    taken: list[str] = []
    used = 0
    for part in parts:
        used += cell_len(part)
        if used > width:
            break
        taken.append(part)
    return taken


def _one_line(text: str) -> str:
    """A cell on one line: line breaks and tabs become single spaces."""
    text = str(text)
    return " ".join(text.split()) if any(c.isspace() and c != " " for c in text) else text


#: Characters a name must not hold, as jobs._check_name refuses them (jobs._hidden_character):
#: they hide in the text or turn the text after them around (bidirectional overrides, isolates
#: and marks, line and paragraph separators, zero-width space, word joiner and the other
#: invisible format characters, fillers that show nothing, byte order mark), so a name would
#: read as another.
HIDDEN_CHARACTERS = frozenset(
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b\u200e\u200f"
    + "".join(map(chr, range(0x2028, 0x202F)))
    + "".join(map(chr, range(0x2060, 0x2065)))
    + "".join(map(chr, range(0x2066, 0x2070)))
    + "\u3164\ufeff\uffa0\ufff9\ufffa\ufffb"
    + "".join(map(chr, range(0x1D173, 0x1D17B)))
    + "\U000e0001"
)
#: The same, for a regular expression's character class.
_HIDDEN = "".join(re.escape(c) for c in sorted(HIDDEN_CHARACTERS))
#: Control characters but tab and line feed (C0, DEL and C1), and the hidden ones: a terminal
#: shows nothing for those, or the text after one turned around (U+202E reverses the line).
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_HIDDEN}]")


def _shown_control(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x80:
        return f"^{chr(code ^ 0x40)}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """Stored text (a job's error) as a terminal should show it: a control character is
    written as ``^[`` (C0, DEL: caret notation) or ``\\x9b`` (C1), so an escape sequence in
    it can neither recolour, clear nor retitle the screen nor move the cursor, and a
    hidden one (HIDDEN_CHARACTERS) as ``\\u202e``, so it can neither hide nor turn the line
    around; tabs and line breaks stay."""
    return _CONTROL.sub(_shown_control, text)


def written_out(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as a person's output shows it: its text (and the text in its lists) ``printable``.
    The SQL API refuses control characters in names, kinds and worker ids, but a schedule
    stored through ``jobs.define`` keeps them, and so does text written by hand or before
    those checks: what a row holds is shown, never obeyed."""
    return {k: _written_out_value(v) for k, v in row.items()}


def _written_out_value(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [printable(v) if isinstance(v, str) else v for v in value]
    return value


#: Every control character, tab and line feed included, and the hidden ones.
_ANY_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{_HIDDEN}]")


def printable_line(text: str) -> str:
    """``printable`` for a message that must stay one line (an error line): tabs and line
    breaks are shown too (``^I``, ``^J``), as every other control character."""
    return _ANY_CONTROL.sub(_shown_control, text.strip())


def _pad(text: str, width: int, right: bool) -> str:
    fill = " " * max(width - visible_len(text), 0)
    return fill + text if right else text + fill


def wrap(text: str, width: int, indent: str = "", *, whole: bool = False, middle: bool = False) -> list[str]:
    """``text`` in lines of at most ``width`` terminal columns, broken at spaces (a wide
    character counts two), the first line keeping the text's leading spaces and the lines
    after it indented by ``indent``; a word too long for any line is cut with an ellipsis
    where it starts (with ``middle``, in its middle, as a table cuts a name), or with ``whole``
    (text that must be read in full) broken across lines. Text that fits is left as it is."""
    if visible_len(text) <= width:
        return [text]
    lines: list[str] = []
    # fresh: nothing on the line yet but its indent (on the first line, the text's own)
    line, fresh = text[: len(text) - len(text.lstrip(" "))], True
    for word in text.split(" "):
        if fresh and not word:
            continue  # no more spaces at the start of a line
        candidate = line + word if fresh else f"{line} {word}"
        if visible_len(candidate) <= width:
            line, fresh = candidate, False
        elif visible_len(indent + word) > width and whole:  # fits no line: break it
            if not fresh:
                lines.append(line.rstrip())
                line = indent
            parts = _clusters(word)
            while parts:
                piece = _head(parts, max(width - visible_len(line), 1)) or parts[:1]
                parts = parts[len(piece) :]
                if parts:
                    lines.append(line + "".join(piece))
                    line = indent
                else:
                    line, fresh = line + "".join(piece), False
        elif visible_len(indent + word) > width:  # fits no line: cut it here
            if middle:  # the word cut, not what precedes it on the line
                before = line if fresh else f"{line} "
                lines.append(before + _cut(word, max(width - visible_len(before), 1), middle=True))
            else:
                lines.append(_cut(candidate, width))
            line, fresh = indent, True
        else:
            lines.append(line.rstrip())
            line, fresh = indent + word, False
    if not fresh:
        lines.append(line)
    return lines


def fit_screen(text: str, rows: int, columns: int, more: str) -> str:
    """``text`` cut to the lines that fill a screen of ``rows`` by ``columns`` (a line
    wider than the screen takes the rows it wraps onto), with a last line saying how many
    were left out (``more`` says what to do about it). No line break at the end, so that
    writing it does not scroll the screen."""
    lines = text.split("\n")

    def height(line: str) -> int:
        return max(1, -(-visible_len(line) // max(columns, 1)))

    if sum(height(line) for line in lines) <= rows:
        return text
    kept: list[str] = []
    used = 0
    for line in lines:
        if used + height(line) > max(rows - 1, 0):
            break
        kept.append(line)
        used += height(line)
    left = len(lines) - len(kept)
    kept.append(clip(f"… {counted(left, 'more line')}: {more}", columns))
    return "\n".join(kept)


def clip(text: str, width: int, marker: str = "…") -> str:
    """``text`` cut with an ellipsis (``marker``) to ``width`` columns (for a line that is
    not a table)."""
    return _cut(_one_line(text), max(width, 1), marker=marker)


def _cut(text: str, width: int, *, middle: bool = False, marker: str = "…") -> str:
    if visible_len(text) <= width:
        return text
    # A cut cell loses its colour rather than its reset code; it is cut by columns, never
    # inside a wide character or between a letter and its accent (the padding makes up a
    # column a wide character could not fill).
    parts = _clusters(_ESCAPES.sub("", text))
    keep = max(width - 1, 0)
    if middle and keep >= 5:
        tail = keep // 2
        return "".join(_head(parts, keep - tail)) + marker + "".join(_head(parts[::-1], tail)[::-1])
    return "".join(_head(parts, keep)) + marker


def _kept_apart(texts: list[str], cut: list[str], width: int, marker: str) -> list[str]:
    """``cut`` (``texts`` cut in the middle to ``width``), where two different texts came out
    the same (names that share a long prefix and a long suffix), cut again around where each
    differs from the others: ``cust…eu-west…unts`` beside ``cust…us-east…unts``."""
    same: dict[str, set[str]] = {}
    for text, short in zip(texts, cut, strict=True):
        if short != text:
            same.setdefault(short, set()).add(text)
    again: dict[str, str] = {}
    for group in same.values():
        if len(group) > 1:
            for text in group:
                again[text] = _cut_at_difference(text, [t for t in group if t != text], width, marker)
    if not again:
        return cut
    return [again.get(text, short) for text, short in zip(texts, cut, strict=True)]


def _cut_at_difference(text: str, others: list[str], width: int, marker: str) -> str:
    """``text`` cut to ``width`` columns keeping its start, its end, and, between two
    markers, the part from where it first differs from the closest of ``others``."""
    parts = _clusters(_ESCAPES.sub("", text))
    if width < 7:
        return _cut(text, width, middle=True, marker=marker)
    differs = max(_common_prefix(parts, _clusters(_ESCAPES.sub("", other))) for other in others)
    room = width - 2 * cell_len(marker)
    end = max(1, room // 4)
    head = _head(parts, end)
    tail = _head(parts[::-1], end)[::-1]
    start = max(differs, len(head))
    stop = len(parts) - len(tail)
    window = _head(parts[start:stop], room - cell_len("".join(head)) - cell_len("".join(tail)))
    if start + len(window) >= stop:  # the window reaches the end: one marker, a longer end
        kept = _head(parts[start:][::-1], width - cell_len("".join(head)) - cell_len(marker))[::-1]
        return "".join(head) + marker + "".join(kept)
    if start == len(head):  # the difference right after the start: one marker, before the end
        return "".join(head) + "".join(window) + marker + "".join(tail)
    return "".join(head) + marker + "".join(window) + marker + "".join(tail)


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


#: Columns of this priority or higher are dropped before any text is cut.
OPTIONAL = 5


def _fit(cols: list[Column], natural: list[int], limit: int) -> tuple[list[int], list[int]]:
    """Until the row fits: drop optional columns (least important first), then cut long
    text with an ellipsis (the least important column first, down to its minimum width),
    then drop the least important of the rest and cut again from full widths (a dropped
    column leaves room, so the others are cut no more than they must be)."""
    keep = list(range(len(cols)))

    def total(widths: list[int]) -> int:
        return sum(widths[i] for i in keep) + 2 * (len(keep) - 1)

    optional = sorted(
        (i for i in keep if cols[i].priority >= OPTIONAL), key=lambda i: (-cols[i].priority, -i)
    )
    while total(natural) > limit and optional:
        keep.remove(optional.pop(0))
    while True:
        widths = list(natural)
        while total(widths) > limit:
            shrinkable = [i for i in keep if cols[i].shrink and widths[i] > cols[i].min_width]
            if not shrinkable:
                break
            cut = max(shrinkable, key=lambda i: (cols[i].priority, widths[i]))
            widths[cut] = max(cols[cut].min_width, widths[cut] - (total(widths) - limit))
        if total(widths) <= limit:
            return keep, widths
        if len(keep) == 1:
            widths[keep[0]] = limit
            return keep, widths
        keep.remove(max(keep, key=lambda i: (cols[i].priority, i)))


# ---------------------------------------------------------------------------- machine formats


#: What JSON leaves unescaped that a terminal acts on: DEL and the C1 controls (U+009B is
#: CSI, the start of an escape sequence), and the HIDDEN_CHARACTERS, which show nothing or turn
#: the text after them around on the screen (a payload holding U+202E would show its line
#: reversed). JSON escapes C0 itself.
_JSON_CONTROL = re.compile(f"[\x7f-\x9f{_HIDDEN}]")


def to_json(value: Any, *, ascii_only: bool = False) -> str:
    """``value`` as indented JSON; ``ascii_only`` escapes what is not ASCII (``\\u62a5``),
    for an output that is not UTF-8: the same document, nothing lost. DEL, C1 controls and
    HIDDEN_CHARACTERS are escaped always (``\\u009b``, ``\\u202e``): still the same document,
    and no escape sequence, hidden text or reversal in a stored value reaches the terminal. A
    Decimal (a jsonb number, read with every digit) is written as that number, digit for
    digit."""
    text = json_numbers.dumps(value, indent=2, ensure_ascii=ascii_only, default=_json_default)
    return json_controls_escaped(text)


def json_controls_escaped(text: str) -> str:
    """JSON text with its DEL, C1 controls and HIDDEN_CHARACTERS escaped (``\\u009b``, a
    surrogate pair past U+FFFF): the same document."""
    return _JSON_CONTROL.sub(lambda m: json.dumps(m.group())[1:-1], text)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


def to_csv(rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(fields), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_cell(row.get(k)) for k in fields})
    return out.getvalue().rstrip("\n")


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, datetime | timedelta):
        return _json_default(value)
    if isinstance(value, Decimal):
        return json_numbers.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json_numbers.dumps(value, ensure_ascii=False, default=_json_default)
    return value
