"""Pre-call guardrail time is a stage of its own in a request's timings."""

from sluicegate.core.slo import Timeline


def test_the_guardrail_stage_sits_between_admission_and_queue() -> None:
    timeline = Timeline(10.0)
    timeline.admitted_s = 10.5
    timeline.guarded_s = 10.75
    timeline.dispatched_s = 11.0
    assert [name for name, _ in timeline.stages(12.0)] == [
        "admission", "guardrail", "queue", "upstream",
    ]  # fmt: skip
    assert dict(timeline.stages(12.0))["guardrail"] == 0.25


def test_a_request_without_pre_call_checks_has_no_guardrail_stage() -> None:
    timeline = Timeline(10.0)
    timeline.admitted_s = 10.5
    assert [name for name, _ in timeline.stages(11.0)] == ["admission", "queue"]


def test_a_checked_answer_has_its_own_stage_before_its_first_byte() -> None:
    timeline = Timeline(10.0)
    timeline.admitted_s = 10.5
    timeline.dispatched_s = 11.0
    timeline.upstream_s = 12.0
    timeline.checked_s = timeline.first_byte_s = 12.25
    stages = timeline.stages(13.0)
    assert [name for name, _ in stages] == [
        "admission", "queue", "upstream", "answer_check", "transfer",
    ]  # fmt: skip
    assert dict(stages)["answer_check"] == 0.25
    assert dict(stages)["transfer"] == 0.0
