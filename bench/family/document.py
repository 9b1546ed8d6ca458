"""The family's document: `family.json` for tools, `family.txt` for people, the worst of
each figure over the variants that ran; and what a variant is judged against, read back
from the document so that a rescore judges alike."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.family import capacity, metrics, variants
from sluicegate.bench import report
from sluicegate.bench.scenario import Slo

DOCUMENT = "family.json"
TEXT = "family.txt"
GATEWAY_METRICS = "gateway-metrics.txt"
"""The gateway's /metrics after a run, in the run's folder: what a rescore reads its own
figures (the predictor's error, refusal timing) from."""


def parameters(variant: variants.Variant) -> dict[str, Any]:
    return {
        "overload": variant.overload,
        "batch": variant.batch,
        "retry": variant.retry,
        "caller_ratio": variant.caller_ratio,
        "slowdown": variant.slowdown,
        "slowdown_at": variant.slowdown_at,
        "timeout_s": variant.timeout_s(),
        "tenants": [
            {
                "name": t.name,
                "weight": t.weight,
                "arrival": t.arrival,
                "share": t.share,
                "prompt_tokens": [t.prompt().low, t.prompt().high],
                "output_tokens": [t.output().low, t.output().high],
            }
            for t in variant.tenants
        ],
    }


def basis(result: Mapping[str, Any], lanes: Mapping[str, Slo], duration_s: float) -> metrics.Basis:
    """What a variant's runs are judged against, from what `family.json` says of it: the
    run and a rescore of it read the same."""
    found = result["parameters"]
    slowdown_at_s = None if found["slowdown"] is None else found["slowdown_at"] * duration_s
    engine = variants.engine(found["batch"])
    return metrics.Basis(
        lanes=lanes,
        weights={t["name"]: float(t["weight"]) for t in found["tenants"]},
        cost=capacity.work(engine),
        capacity=result["capacity"]["effective"],
        batch=found["batch"],
        duration_s=duration_s,
        promise_s=variants.PROMISE_S,
        slowdown_at_s=slowdown_at_s,
        step_s=engine.step_base_s * engine.time_scale,
    )


def write(out: Path, doc: Mapping[str, Any]) -> None:
    """After every variant, so a run cut short keeps what it measured."""
    report.write_json(out / DOCUMENT, doc)
    (out / TEXT).write_text(text(doc))


def worst(results: Sequence[Mapping[str, Any]], policy: str) -> dict[str, float]:
    """The worst of each figure over the variants that ran (NaN-free where measured)."""
    runs = [r[f"policy_{policy}"] for r in results if f"policy_{policy}" in r]

    def pick(values: list[float | None], choose: Callable[[list[float]], float]) -> float:
        """None where a rescore kept a figure it could not recompute, read back as null."""
        found = [v for v in values if v is not None and not math.isnan(v)]
        return choose(found) if found else math.nan

    recoveries = [float(r["recovery"]["recovery_s"]) for r in runs if r["recovery"] is not None]
    return {
        "goodput_of_capacity": pick([r["goodput_of_capacity"] for r in runs], min),
        "admitted_ttft_p95_of_promise": pick(
            [r["admitted_ttft_p95_of_promise"] for r in runs], max
        ),
        "refusal_p99_ms": pick([r["refusal_p99_ms"] for r in runs], max),
        "gateway_refusal_p99_ms": pick([r["gateway_refusal_p99_ms"] for r in runs], max),
        "below_share_queue_wait_p95_ms": pick(
            [r["at_or_below_share"]["queue_wait_p95_ms_max"] for r in runs], max
        ),
        "below_share_refused_fraction": pick(
            [r["at_or_below_share"]["refused_fraction_max"] for r in runs], max
        ),
        "below_share_windowed_queue_wait_p95_ms": pick(
            [r["at_or_below_share"]["windowed"]["queue_wait_p95_ms"] for r in runs], max
        ),
        "below_share_windowed_refused_fraction": pick(
            [r["at_or_below_share"]["windowed"]["refused_fraction"] for r in runs], max
        ),
        "above_share_jain": pick([r["above_share"]["jain_served_of_share"] for r in runs], min),
        "within_share_queue_wait_p95_ms": pick(
            [r["within_share"]["queue_wait_p95_ms"] for r in runs], max
        ),
        "within_share_refused_fraction": pick(
            [r["within_share"]["refused_fraction"] for r in runs], max
        ),
        "within_share_gateway_wait_p95_ms": pick(
            [r["within_share"]["gateway_wait_p95_ms"] for r in runs], max
        ),
        "within_share_asked_of_capacity": pick(
            [r["within_share"]["asked_of_capacity"] for r in runs], max
        ),
        "protected_queue_wait_p95_ms": pick(
            [p["queue_wait_p95_ms"] for r in runs if (p := protected(r)) is not None], max
        ),
        "protected_refused_fraction": pick(
            [p["refused_fraction"] for r in runs if (p := protected(r)) is not None], max
        ),
        "above_share_jain_windowed": pick([r["above_share"]["jain_windowed"] for r in runs], min),
        "recovery_s": pick(recoveries, max),
        "longest_pause_s": pick([r["pauses"]["longest_s"] for r in runs], max),
        "paused_past_promise": pick([r["pauses"]["past_promise"] for r in runs], max),
        "predictor_error_p95_s": pick(
            [r["predictor"]["p95_s"] for r in runs if r["predictor"] is not None], max
        ),
        "queued_unserved_fraction": pick([queued_unserved(r) for r in runs], max),
        "unrecovered": float(
            sum(not r["recovery"]["recovered"] for r in runs if r["recovery"] is not None)
        ),
    }


def document(setup: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return report.envelope(
        "family",
        setup,
        DEFINITIONS,
        [],
        variants=list(results),
        worst={
            policy: worst(results, policy)
            for policy in ("on", "off")
            if any(f"policy_{policy}" in result for result in results)
        },
    )


DEFINITIONS = {
    "capacity": capacity.__doc__ or "",
    "effective capacity": "with a slowdown, the normal and slowed capacities weighted by the "
    "time the run spent at each",
    "work": "a request's seconds of a full backend batch (its prefill and its share of the "
    "full-batch decode steps, from the tokens it asked for): goodput and fair shares are "
    "counted in work, so a policy cannot score by serving short requests first, and a run "
    "whose mix of tenants differs from the probe's (closed loops, bursts) still compares",
    "goodput": "distinct requests (a request and its retries count once) that succeeded with "
    "their first token inside the 2 s promise from their first send: their work per second "
    "of the run over the capacity's work per second (goodput %); the same count in "
    "requests/s over capacity in requests/s is goodput_rps_of_capacity",
    "admitted TTFT": "the successful attempt's own send to first token, p95",
    "refusal p99": metrics.REFUSAL_SOURCE,
    "demand": "work asked per second by a tenant's requests, served or not",
    "fair share": "max-min fair share by weight of the capacity's work per second (the "
    "capacity's rate x the expected work of the variant's requests) among tenants that "
    "sent anything",
    "queue wait": "TTFT (first send, retries included) less the simulator's own prefill step "
    "(sim_timing in the usage event): waiting in the gateway's queue, the backend's queue "
    "and between retries alike, so policy on and off compare",
    "refused fraction": "requests with at least one attempt refused by the gateway",
    "Jain": "Jain's index of served / fair share among tenants whose demand exceeds their share",
    "within share at send": "a request whose tenant had fewer requests outstanding (first "
    "sent, not ended) before it than the tenant's max-min share by weight of the backend's "
    "batch, the demands being every tenant's outstanding requests at its first send: fair "
    "share among the tenants active then, so a burst is within share only up to its part "
    "of the batch; queue wait p95 and refused fraction of those requests, all tenants "
    "together (per tenant in the JSON)",
    "gateway wait": "of a served request, the part the gateway held it: from its first send "
    "to its last attempt (refused attempts and the backoff after them), plus that attempt's "
    "arrival to dispatch from the gateway's Server-Timing `queue`; the rest of the queue "
    "wait is the backend's (its own queue and the engine step running when it came)",
    "Jain (windowed)": "Jain's index, among tenants above their share in at least one window "
    "of the promise's length (2 s, by first send), of the work served over the work of "
    "their shares, both summed over those windows; demand and max-min shares per window, "
    "so a burst is judged against the capacity of its window; served work counted where "
    "it was done (spread over each answer's span)",
    "at or below share (windowed)": "queue wait p95 and refused fraction of the requests "
    "sent in windows of the promise's length where their tenant asked at most its max-min "
    "share of the capacity's work: a reading of the issue's 'tenants at or below their "
    "fair share' by demand, refused requests included, so what it judges within share "
    "never asks more than the capacity",
    "asked x capacity": "the work a class of requests asked per second over the capacity's "
    "work per second; the requests within share at send can ask more than 1 (a refused "
    "request stops being outstanding at once, so a tenant refused quickly looks within "
    "its share again), and such a class cannot all be served at once by any scheduler",
    "refusals by code": "in the JSON, per class: how many of its requests the gateway first "
    "turned away with each code (overloaded: the predictor, shed: CoDel, expired: the "
    "queue's age limit); the windowed class also gives its requests beyond share at send "
    "apart (beyond_share_at_send), where the two readings disagree",
    "beyond reach": "of the requests of tenants at or below their share (over the run, the "
    "worst such tenant; per window; at send), the part no scheduler could serve within "
    "100 ms of their send unless it paused or cut answers it had started: the backend "
    "starts at most a batch of sequences in any span as long as the run's shortest "
    "answer (its fewest output tokens at the engine's shortest step), so of a class's "
    "requests sent within that span less 100 ms of one another, those beyond a batch "
    "wait longer or are refused (for these send times); from about 6 % on, in a class of "
    "a hundred requests or more, the class's target (wait p95 <= 100 ms, < 1 % refused) "
    "is out of such a scheduler's reach",
    "recovery": "from the slowdown to the end of the last 1 s window (by attempt start) whose "
    "admitted TTFT p95 broke the promise; 0 when none did",
    "longest pause": "of the streamed answers that succeeded, the longest time one stood "
    "still between two tokens (a slot handed over pauses an answer; its lane's promise "
    "bounds that pause, its prefill again and the engine's slowest steps not counted), "
    "and how many answers stood still past the top lane's promise (every flow of the "
    "family is in it)",
    "within share by the gateway": metrics.PROTECTED_SOURCE,
    "predictor error": metrics.PREDICTOR_SOURCE,
    "queued, refused after": metrics.QUEUE_SOURCE,
    "refusal p99 (gateway)": metrics.GATEWAY_REFUSAL_SOURCE,
}


def text(doc: Mapping[str, Any]) -> str:
    headers = [
        "variant",
        "policy",
        "capacity/s",
        "goodput %",
        "TTFT p95 s",
        "refusal p99 ms",
        "gw refusal p99 ms",
        "fair wait p95 ms",
        "fair refused %",
        "Jain above",
        "at or below share (windowed): wait p95 ms / refused %",
        "within share at send: wait p95 ms / refused %",
        "within share: gateway wait p95 ms",
        "within share at send: asked x capacity",
        "within share by the gateway: queue wait p95 ms / refused %",
        "beyond reach % (run / window / send)",
        "Jain above (windowed)",
        "recovery s",
        "longest pause s / past promise",
        "pred. err p50/p95 s",
        "queued, refused after %",
    ]
    rows = []
    for result in doc["variants"]:
        if "error" in result:
            rows.append([result["variant"], "-", result["error"], *["-"] * (len(headers) - 3)])
            continue
        for policy in ("on", "off"):
            if f"policy_{policy}" not in result:
                continue
            f = result[f"policy_{policy}"]
            below = f["at_or_below_share"]
            rec = f["recovery"]
            rows.append(
                [
                    result["variant"],
                    policy,
                    _num(result["capacity"]["effective"]["rps"], 2),
                    _num(100 * f["goodput_of_capacity"], 1),
                    _num(f["admitted_ttft_p95_s"], 2),
                    _num(f["refusal_p99_ms"], 1),
                    _num(f["gateway_refusal_p99_ms"], 2),
                    _num(below["queue_wait_p95_ms_max"], 0),
                    _num(100 * below["refused_fraction_max"], 1),
                    _num(f["above_share"]["jain_served_of_share"], 3),
                    _wait_refused(
                        below["windowed"]["queue_wait_p95_ms"],
                        below["windowed"]["refused_fraction"],
                    ),
                    _wait_refused(
                        f["within_share"]["queue_wait_p95_ms"],
                        f["within_share"]["refused_fraction"],
                    ),
                    _num(f["within_share"]["gateway_wait_p95_ms"], 0),
                    _num(f["within_share"]["asked_of_capacity"], 2),
                    _protected_text(protected(f)),
                    _beyond_reach(f),
                    _num(f["above_share"]["jain_windowed"], 3),
                    "-" if rec is None else _recovery(rec),
                    _pauses(f["pauses"]["longest_s"], f["pauses"]["past_promise"]),
                    _predictor(f["predictor"]),
                    _percent_text(queued_unserved(f)),
                ]
            )
    for policy, w in doc["worst"].items():
        rows.append(
            [
                "WORST",
                policy,
                "",
                _num(100 * w["goodput_of_capacity"], 1),
                _num(w["admitted_ttft_p95_of_promise"] * variants.PROMISE_S, 2),
                _num(w["refusal_p99_ms"], 1),
                _num(w["gateway_refusal_p99_ms"], 2),
                _num(w["below_share_queue_wait_p95_ms"], 0),
                _num(100 * w["below_share_refused_fraction"], 1),
                _num(w["above_share_jain"], 3),
                _wait_refused(
                    w["below_share_windowed_queue_wait_p95_ms"],
                    w["below_share_windowed_refused_fraction"],
                ),
                _wait_refused(
                    w["within_share_queue_wait_p95_ms"], w["within_share_refused_fraction"]
                ),
                _num(w["within_share_gateway_wait_p95_ms"], 0),
                _num(w["within_share_asked_of_capacity"], 2),
                _wait_refused(w["protected_queue_wait_p95_ms"], w["protected_refused_fraction"]),
                "-",
                _num(w["above_share_jain_windowed"], 3),
                _num(w["recovery_s"], 0),
                _pauses(w["longest_pause_s"], w["paused_past_promise"]),
                "" if policy == "off" else f"-/{_num(w['predictor_error_p95_s'], 2)}",
                _percent_text(w["queued_unserved_fraction"]),
            ]
        )
    described = "\n".join(f"  {r['variant']}: {r['description']}" for r in doc["variants"])
    notes = "\n".join(f"  {k}: {v}" for k, v in doc["definitions"].items())
    table = report.table(headers, rows, left=2)
    return f"Traffic family\n{described}\n\n{table}\n\nDefinitions:\n{notes}\n"


def _recovery(found: Mapping[str, Any]) -> str:
    value = _num(found["recovery_s"], 0)
    return value if found["recovered"] else f">{value}"


def _beyond_reach(figures: Mapping[str, Any]) -> str:
    below = figures["at_or_below_share"]
    parts = (
        below["beyond_reach_fraction_max"],
        below["windowed"]["beyond_reach_fraction"],
        figures["within_share"]["beyond_reach_fraction"],
    )
    return " / ".join(_num(100 * part, 0) for part in parts)


def _pauses(longest_s: float, past_promise: float) -> str:
    """'-' when no answer told its pauses (records made before they were timed)."""
    return "-" if math.isnan(longest_s) else f"{_num(longest_s, 2)} / {_num(past_promise, 0)}"


def _wait_refused(wait_ms: float | None, fraction: float | None) -> str:
    """Either may be None: a NaN figure read back from the JSON as null."""
    return f"{_num(wait_ms, 0)} / {_num(None if fraction is None else 100 * fraction, 1)}"


def queued_unserved(figures: Mapping[str, Any]) -> float | None:
    """The share of a run's queued requests refused after their wait; None where the
    gateway did not count it (policy off, or a run from before it did)."""
    queue = figures.get("gateway_queue")
    return None if queue is None else queue["unserved_fraction"]


def protected(figures: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The requests the gateway judged within their share; None where it did not count
    them (policy off, or a run from before it did)."""
    return figures.get("gateway_protected")


def _protected_text(found: Mapping[str, Any] | None) -> str:
    if found is None:
        return "-"
    return _wait_refused(found["queue_wait_p95_ms"], found["refused_fraction"])


def _percent_text(fraction: float | None) -> str:
    return "-" if fraction is None else _num(100 * fraction, 1)


def _predictor(found: Mapping[str, Any] | None) -> str:
    if found is None:
        return "-"
    return f"{_num(found['p50_s'], 2)}/{_num(found['p95_s'], 2)}"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"
