"""A run's request lines: what is written is what a rescore reads back."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest

from sluicegate.bench import client, runreport
from sluicegate.bench.records import Attempt, Record
from sluicegate.bench.scenario import Slo

LANES = {"interactive": Slo(ttft_s=2.0)}


def retried() -> Record:
    refused = Attempt(1.25, 1.252, 429, "tenant_rate_limited", 0.5, True)
    served = Attempt(
        2.0,
        4.75,
        200,
        should_retry=False,
        first_token_s=2.4,
        last_token_s=4.7,
        prompt_tokens=310,
        output_tokens=42,
        backend_prefill_s=0.031,
    )
    return Record("t1", "interactive", 3, True, 1.2, (refused, served), 310, 64)


def test_a_record_read_back_from_its_line_is_the_record_written(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    record = retried()
    runreport.write_records(path, [record, record], LANES)
    back = runreport.read_records(path)
    assert back == [record, record]
    assert back[0].queue_wait_s == pytest.approx(2.4 - 1.2 - 0.031)


def written_without(record: Record, field: str, path: Path) -> Path:
    """`record`'s line with `field` taken out of every attempt, as an older run wrote it."""
    line = runreport.record_json(record, LANES)
    attempts = line["attempts"]
    assert isinstance(attempts, list)
    for attempt in attempts:
        del attempt[field]
    path.write_bytes(orjson.dumps(line) + b"\n")
    return path


def test_a_line_missing_an_attempts_field_is_refused_not_defaulted(tmp_path: Path) -> None:
    path = written_without(retried(), "backend_prefill_s", tmp_path / "requests.jsonl")
    with pytest.raises(KeyError):
        runreport.read_records(path)


def test_a_line_from_before_the_longest_gap_was_kept_reads_it_as_unknown(
    tmp_path: Path,
) -> None:
    record = replace_gaps(retried(), 0.25)
    path = written_without(record, "longest_gap_s", tmp_path / "requests.jsonl")
    (back,) = runreport.read_records(path)
    assert [attempt.longest_gap_s for attempt in back.attempts] == [None, None]


def replace_gaps(record: Record, gap_s: float) -> Record:
    attempts = tuple(dataclasses.replace(a, longest_gap_s=gap_s) for a in record.attempts)
    return dataclasses.replace(record, attempts=attempts)


def test_an_exchange_keeps_the_longest_time_between_two_tokens() -> None:
    """How long a streamed answer stood still (a slot handed over pauses it)."""
    times = iter([0.0, 0.5, 0.55, 1.3, 1.35, 1.4])
    exchange = client._Exchange(lambda: next(times))
    exchange.token()
    assert exchange.finish("ok").longest_gap_s is None
    exchange.token()
    exchange.token()
    assert exchange.finish("ok").longest_gap_s == pytest.approx(0.8)
