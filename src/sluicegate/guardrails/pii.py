"""The PII checker: e-mail addresses, phone numbers, cards, IBANs, US SSNs, IP addresses
and API keys, each found as a span of its kind so that a mask replaces exactly it. The
scan hands the event loop back in bounded turns (`scan`), so a 32k-token prompt does not
stall other requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluicegate.guardrails import pii_kinds
from sluicegate.guardrails.checker import PASSED, Span, Stage, Verdict
from sluicegate.guardrails.scan import WORK_PER_TURN, scan

DEFAULT_REGIONS = ("US", "GB", "DE", "FR", "JP", "IN")
"""Whose national formats are read as phone numbers; `+` or `00` numbers are always."""


class PiiChecker:
    """Flags the configured kinds of personal data, with one span per item found."""

    def __init__(
        self,
        kinds: Iterable[str] = pii_kinds.KINDS,
        regions: Sequence[str] = DEFAULT_REGIONS,
        name: str = "pii",
        work_per_turn: int | None = WORK_PER_TURN,
    ) -> None:
        """`work_per_turn` None scans each text in one go (for comparison only)."""
        wanted = tuple(dict.fromkeys(kinds))
        unknown = [kind for kind in wanted if kind not in pii_kinds.KINDS]
        if unknown or not wanted:
            raise ValueError(
                f"PII kinds {unknown or 'none'} are not among {', '.join(pii_kinds.KINDS)}"
            )
        bad = [region for region in regions if region not in pii_kinds.SUPPORTED_REGIONS]
        if bad:
            raise ValueError(f"phone regions {bad} are not ISO 3166 regions phonenumbers knows")
        every = pii_kinds.kinds(tuple(regions))
        self.name = name
        self.kinds = wanted
        self._finders = tuple(finder for kind in wanted for finder in every[kind])
        self._work_per_turn = work_per_turn

    async def check(self, text: str, stage: Stage) -> Verdict:
        spans = await scan(text, self._finders, self._work_per_turn)
        if not spans:
            return PASSED
        kept = _strongest(spans)
        return Verdict(True, kept, tuple(sorted({span.kind for span in kept})))


def _strongest(spans: list[Span]) -> tuple[Span, ...]:
    """Sorted spans; where spans overlap, those of the most specific kind among them
    (the order of KINDS): the digits of an IBAN or a card can also read as a phone
    number, and the mask should name what the item is."""
    spans.sort(key=lambda span: (span.start, span.end, span.kind))
    kept: list[Span] = []
    cluster: list[Span] = []
    for span in [*spans, None]:
        if span is None or (cluster and span.start >= max(s.end for s in cluster)):
            rank = min(pii_kinds.KINDS.index(s.kind) for s in cluster)
            kept.extend(s for s in cluster if pii_kinds.KINDS.index(s.kind) == rank)
            cluster = []
        if span is not None:
            cluster.append(span)
    return tuple(kept)
