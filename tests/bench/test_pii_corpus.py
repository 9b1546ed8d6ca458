"""The PII checker on a small labelled corpus meets the targets the full one is held to:
recall of at least 0.98 per kind, fewer than 2 % of clean samples altered."""

from __future__ import annotations

from bench.pii_corpus import GENERATORS, Sample, corpus, measure


async def test_the_pii_checker_meets_its_recall_and_clean_targets_on_a_small_corpus() -> None:
    result = await measure(corpus(seed=20261207, per_kind=60, clean_count=300))
    assert set(result.recall) == set(GENERATORS)
    assert min(result.recall.values()) >= 0.98, result.misses
    assert result.altered < 0.02, result.false_alarms


def test_the_corpus_replays_from_its_seed_and_labels_each_positive() -> None:
    first = corpus(seed=7, per_kind=5, clean_count=20)
    assert first == corpus(seed=7, per_kind=5, clean_count=20)
    assert first != corpus(seed=8, per_kind=5, clean_count=20)
    positives = [sample for sample in first if sample.kind is not None]
    assert len(positives) == 5 * len(GENERATORS)
    assert all(_labelled(sample) for sample in positives)


def _labelled(sample: Sample) -> bool:
    item = sample.text[sample.start : sample.end]
    return item.strip() == item and bool(item) and sample.text.count(item) == 1
