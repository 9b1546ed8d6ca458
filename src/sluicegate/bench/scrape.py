"""Gauges read from /metrics while a run lasts: queue depths, in-flight counts, batch sizes.

Only gauges whose names match the scenario's patterns are kept; the lines of every other
metric are dropped before parsing, so a scrape costs the client little of its event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 2.0
MAX_SCRAPES = 100_000
Points = list[tuple[float, float]]
_CREATED = "_created"
"""prometheus_client declares each counter's and histogram's creation time as a gauge."""


class Scraper:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Mapping[str, str],
        patterns: Sequence[str],
        interval_s: float,
        since: Callable[[], float],
    ) -> None:
        self._session = session
        self._urls = urls
        self._patterns = patterns
        self._wanted = re.compile("|".join(fnmatch.translate(p) for p in patterns) or "(?!)")
        self._interval_s = interval_s
        self._since = since
        self.series: dict[str, dict[str, Points]] = defaultdict(dict)
        """Metric name -> `SOURCE label=value,...` -> (seconds, value) points."""
        self.failures: Counter[str] = Counter()

    async def run(self, stop: asyncio.Event) -> None:
        for _ in range(MAX_SCRAPES):
            await asyncio.gather(*(self._scrape(source, url) for source, url in self._urls.items()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)
            if stop.is_set():
                return

    def notes(self) -> list[str]:
        found = list(self.series)
        notes = [
            f"no gauge matching {pattern!r} at {', '.join(self._urls)}: not plotted"
            for pattern in self._patterns
            if not fnmatch.filter(found, pattern)
        ]
        notes += [f"{source} /metrics failed {n} times" for source, n in self.failures.items()]
        return notes

    async def _scrape(self, source: str, url: str) -> None:
        at = self._since()
        try:
            timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
            async with self._session.get(url, timeout=timeout) as response:
                response.raise_for_status()
                text = await response.text()
            families = list(text_string_to_metric_families(self._kept(text)))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            self.failures[source] += 1
            return
        for family in families:
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                line = f"{source} {labels}".rstrip()
                self.series[family.name].setdefault(line, []).append((at, sample.value))

    def _kept(self, text: str) -> str:
        """The lines of wanted gauges only: declared `# TYPE NAME gauge`, NAME matching."""
        lines = text.splitlines()
        gauges = {
            words[2]
            for line in lines
            if line.startswith("# TYPE ")
            and (words := line.split())[3:] == ["gauge"]
            and self._wanted.match(words[2])
            and not words[2].endswith(_CREATED)
        }
        return "\n".join(line for line in lines if _name(line) in gauges)


OUTCOMES = "sluicegate_request_outcomes_total"


async def outcomes(session: aiohttp.ClientSession, url: str) -> dict[str, dict[str, float]] | None:
    """The gateway's own count of finished requests by lane and kind (met, missed, ...),
    read once from its /metrics; None when it cannot be read."""
    try:
        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
        async with session.get(url, timeout=timeout) as response:
            response.raise_for_status()
            text = await response.text()
        lines = "\n".join(line for line in text.splitlines() if line.startswith(OUTCOMES))
        families = list(text_string_to_metric_families(lines))
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    found: dict[str, dict[str, float]] = defaultdict(dict)
    for family in families:
        for sample in family.samples:
            lane, kind = sample.labels.get("lane", ""), sample.labels.get("kind", "")
            found[lane][kind] = found[lane].get(kind, 0.0) + sample.value
    return dict(found)


def _name(line: str) -> str:
    """The metric a line is about: a sample's name, or a comment's third word."""
    if line.startswith("#"):
        words = line.split(maxsplit=3)
        return words[2] if len(words) > 2 else ""
    return re.split(r"[{ ]", line, maxsplit=1)[0]
