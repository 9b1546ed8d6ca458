"""Budget periods and days on the calendar of a time zone, from unix seconds.

A period is named by its first day (`2026-12-01` for December, `2026-12-07` for a day),
which makes the shared store's keys and the durable record's rows the same whatever
replica computes them. Its end is the next period's start in that zone, so a month
has its own length and a day around a daylight-saving change 23 or 25 hours.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from sluicegate.core.types import Period


class Window(NamedTuple):
    name: str
    """The period's first day, ISO."""
    start_s: float
    end_s: float


def window(period: Period, at_s: float, zone: ZoneInfo) -> Window:
    """The period of kind `period` holding the instant `at_s`, in `zone`."""
    day = datetime.fromtimestamp(at_s, zone).date()
    if period is Period.DAILY:
        first, after = day, day + timedelta(days=1)
    else:
        first = day.replace(day=1)
        after = (first + timedelta(days=32)).replace(day=1)
    return Window(first.isoformat(), _midnight(first, zone), _midnight(after, zone))


def _midnight(day: date, zone: ZoneInfo) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()


class Days:
    """The day (in `zone`) of an instant, recomputed only when a day ends: asked once
    per priced attempt, so the calendar is not consulted each time."""

    __slots__ = ("_current", "_zone")

    def __init__(self, zone: ZoneInfo) -> None:
        self._zone = zone
        self._current = Window("", 0.0, 0.0)

    def of(self, at_s: float) -> str:
        current = self._current
        if not current.start_s <= at_s < current.end_s:
            current = self._current = window(Period.DAILY, at_s, self._zone)
        return current.name
