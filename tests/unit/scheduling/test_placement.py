"""Where an attempt goes: each strategy on a fake clock and scripted backend samples, and
one functional test that runs every strategy through the same interface."""

from __future__ import annotations

import dataclasses
import random

import pytest

from sluicegate.capacity.breaker import Breaker
from sluicegate.capacity.gates import BackendSample, MetricsGate, OpenGate
from sluicegate.capacity.pools import Pool
from sluicegate.core.call import Call
from sluicegate.core.leases import Leases
from sluicegate.core.types import (
    BackendMetrics,
    BreakerPolicy,
    Deployment,
    Endpoint,
    Lane,
    Model,
    PoolSpec,
    PrefixAffinity,
    RoutePolicy,
    Tenant,
    Timeouts,
)
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.placement import Reason, load_of
from sluicegate.scheduling.placement.prefix_affinity import chained, render
from sluicegate.scheduling.plugin import Dispatch
from sluicegate.scheduling.routing import Routing, placement_for
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock

SPEC = Deployment("x", "openai", "http://x/v1", "m", None, Timeouts(1, 1, 1), 8, ("x",))
SMALL = PrefixAffinity(block_bytes=32, index_blocks=64)
SYSTEM = "You are the assistant of a very long application prompt. " * 4
WENT = Dispatch(0.0, None, None, False, False, False)


def target(clock: FakeClock, name: str, size: int = 8, metrics: bool = False) -> Target:
    deployment = dataclasses.replace(SPEC, name=name, pools=(name,))
    pool = Pool(PoolSpec(name, size), Leases(MemoryLimitStore(clock), clock))
    gate = MetricsGate(BackendMetrics("http://x/metrics", max_num_seqs=size), clock)
    return Target(
        deployment, (pool,), gate if metrics else OpenGate(), Breaker(BreakerPolicy(), clock)
    )


def sampled(t: Target, running: float, waiting: float = 0.0, kv: float | None = None) -> None:
    assert isinstance(t.gate, MetricsGate)
    t.gate.update(BackendSample(waiting, running, kv, None, None))


def attempt(*messages: str, clock: FakeClock | None = None) -> Attempt:
    now = 0.0 if clock is None else clock.now()
    turns = [{"role": "system", "content": SYSTEM}]
    turns += [{"role": "user", "content": text} for text in messages]
    call = Call(
        Endpoint.CHAT,
        Tenant("a", None),
        Model("m", ()),
        RoutePolicy(),
        Lane("chat"),
        {"model": "m", "messages": turns},
        True,
        now,
        now + 10.0,
        100,
        200,
    )
    return Attempt(call)


def routing(strategy: str, targets: list[Target], spec: PrefixAffinity = SMALL) -> Routing:
    model = Model("m", tuple(t.deployment for t in targets), strategy, spec)
    return Routing(targets, placement_for(model, targets))


def sent(r: Routing, a: Attempt, index: int = 0) -> str:
    """Where `a` goes when its candidate at `index` takes it; told to the routing."""
    chosen = r.candidates(a)[index]
    a.target = chosen
    r.dispatched(a, WENT)
    return chosen.deployment.name


STRATEGIES = ("fallback", "round_robin", "least_loaded", "prefix_affinity")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_orders_every_deployment_and_names_its_first(strategy):
    """Random loads and prompts: each order is the deployments, each once, the first the
    one the strategy names, and what went where is counted as its first choice or as a
    fallback past it."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    clock = FakeClock()
    targets = [target(clock, name, metrics=True) for name in ("a", "b", "c")]
    r = routing(strategy, targets)
    for i in range(200):
        for t in targets:
            sampled(t, rng.uniform(0, 10), rng.uniform(0, 3), rng.choice((None, rng.random())))
        a = attempt(*(f"turn {n}" for n in range(rng.randint(0, 6))))
        order = r.candidates(a)
        assert sorted(t.deployment.name for t in order) == ["a", "b", "c"], seed
        assert a.placed is not None
        assert a.placed.first == order[0].deployment.name, seed
        sent(r, a, index=i % 3 // 2)
    counted = sum(r.chosen.values())
    assert counted == 200, seed
    fallbacks = sum(n for (_, reason), n in r.chosen.items() if reason is Reason.FALLBACK)
    assert fallbacks == sum(1 for i in range(200) if i % 3 // 2), seed


def test_fallback_keeps_the_configured_order_and_round_robin_rotates_it():
    clock = FakeClock()
    targets = [target(clock, name) for name in ("a", "b", "c")]
    chain = routing("fallback", targets)
    assert [sent(chain, attempt()) for _ in range(3)] == ["a", "a", "a"]
    rotation = routing("round_robin", targets)
    assert [sent(rotation, attempt()) for _ in range(3)] == ["a", "b", "c"]


def test_least_loaded_reads_each_backend_by_its_own_batch():
    """`a` runs 6 of a batch of 8, `b` 12 of a batch of 32: `b` has more room though it
    runs more; the KV cache counts where it is the fuller."""
    clock = FakeClock()
    a, b = target(clock, "a", 8, metrics=True), target(clock, "b", 32, metrics=True)
    sampled(a, 6)
    sampled(b, 12)
    r = routing("least_loaded", [a, b])
    assert sent(r, attempt()) == "b"
    sampled(b, 12, kv=0.9)
    assert load_of(b) == 0.9
    assert sent(r, attempt()) == "a"


def test_least_loaded_counts_its_own_sends_since_the_sample():
    clock = FakeClock()
    a, b = target(clock, "a", metrics=True), target(clock, "b", metrics=True)
    sampled(a, 2)
    sampled(b, 3)
    for _ in range(2):
        a.gate.sent()
    assert load_of(a) == pytest.approx(4 / 8)
    assert sent(routing("least_loaded", [a, b]), attempt()) == "b"


def test_with_no_batch_configured_sends_since_the_sample_still_count():
    """Backends whose batch the config leaves out, behind pools far wider than it: their
    KV cache in use, as last scraped, must not outweigh the sends made since, or every
    send between two scrapes goes to the one that was emptiest at the last. The batch
    is then the most requests the backend was seen running."""
    clock = FakeClock()
    targets = {}
    for name in ("a", "b"):
        deployment = dataclasses.replace(SPEC, name=name, pools=(name,))
        pool = Pool(PoolSpec(name, 256), Leases(MemoryLimitStore(clock), clock))
        gate = MetricsGate(BackendMetrics("http://x/metrics"), clock)
        targets[name] = Target(deployment, (pool,), gate, Breaker(BreakerPolicy(), clock))
        sampled(targets[name], 8, kv=0.6)
    sampled(targets["a"], 4, kv=0.30)
    sampled(targets["b"], 4, kv=0.25)
    r = routing("least_loaded", list(targets.values()))
    went = []
    for _ in range(4):
        went.append(sent(r, attempt()))
        targets[went[-1]].gate.sent()
    assert sorted(went) == ["a", "a", "b", "b"]


def test_without_metrics_or_with_a_stale_sample_the_gateways_own_attempts_count():
    clock = FakeClock()
    a, b = target(clock, "a", metrics=True), target(clock, "b")
    sampled(a, 0)
    b.breaker.started()
    assert (load_of(a), load_of(b)) == (0.0, 1 / 8)
    clock.advance(5.0)
    assert load_of(a) == 0.0
    for _ in range(3):
        a.breaker.started()
    assert load_of(a) == 3 / 8
    assert sent(routing("least_loaded", [a, b]), attempt()) == "b"


def test_least_loaded_spreads_ties_in_turn():
    clock = FakeClock()
    targets = [target(clock, name) for name in ("a", "b", "c")]
    r = routing("least_loaded", targets)
    assert sorted(sent(r, attempt()) for _ in range(3)) == ["a", "b", "c"]


def test_a_conversation_goes_back_where_its_earlier_turns_went():
    """The first turn goes where its prompt hashes; the second, which begins with the
    first, goes there too, whatever its own hash says, and is counted an affinity hit."""
    clock = FakeClock()
    targets = [target(clock, name) for name in ("a", "b", "c", "d")]
    r = routing("prefix_affinity", targets)
    first = sent(r, attempt("what is the weather like on the coast today?"))
    for turn in range(2, 6):
        words = [f"and then, question number {n} of this conversation" for n in range(turn)]
        a = attempt("what is the weather like on the coast today?", *words)
        assert sent(r, a) == first
        assert a.placed is not None
        assert a.placed.reason is Reason.AFFINITY
    view = r.view()
    assert view["estimated_hit_ratio"] > 0.5
    assert view["chosen"] == {first: {"hash": 1, "affinity": 4}}


def test_two_gateways_send_a_new_prompt_to_the_same_deployment():
    """No shared index: the first block decides, the same on every replica."""
    clock = FakeClock()
    names = ("a", "b", "c", "d", "e")
    one = routing("prefix_affinity", [target(clock, n) for n in names])
    other = routing("prefix_affinity", [target(clock, n) for n in reversed(names)])
    spread = set()
    for app in range(20):
        a = attempt(f"application {app}: " + "a long system prompt of its own. " * 4)
        b = attempt(f"application {app}: " + "a long system prompt of its own. " * 4)
        went = sent(one, a)
        assert sent(other, b) == went
        spread.add(went)
    assert len(spread) >= 3


def test_affinity_gives_way_to_a_deployment_loaded_beyond_the_others():
    clock = FakeClock()
    targets = [target(clock, name, metrics=True) for name in ("a", "b")]
    for t in targets:
        sampled(t, 1)
    r = routing("prefix_affinity", targets)
    home = sent(r, attempt("a question"))
    other = next(t for t in targets if t.deployment.name != home)
    here = next(t for t in targets if t.deployment.name == home)
    sampled(here, 8)
    sampled(other, 6)
    a = attempt("a question", "a follow-up")
    assert sent(r, a) == home, "8 of 8 against a mean of 7 is within 1.25x"
    sampled(other, 1)
    b = attempt("a question", "a follow-up")
    assert sent(r, b) == other.deployment.name
    assert b.placed is not None
    assert b.placed.reason is Reason.OVERRIDE


def test_one_request_above_the_others_is_not_beyond_the_bound():
    """With a batch of 8, one request more than the others passes 1.25x the mean; the
    home deployment keeps the turn. Two more are beyond the ratio and beyond one
    request's share of the batch: the turn goes to the least loaded."""
    clock = FakeClock()
    targets = [target(clock, name, metrics=True) for name in ("a", "b", "c", "d")]
    r = routing("prefix_affinity", targets)
    for t in targets:
        sampled(t, 2)
    home = next(t for t in targets if t.deployment.name == sent(r, attempt("a question")))
    others = [t for t in targets if t is not home]
    sampled(home, 3)
    for t in others:
        sampled(t, 2)
    assert load_of(home) > 1.25 * sum(load_of(t) for t in targets) / len(targets)
    a = attempt("a question", "a follow-up")
    assert sent(r, a) == home.deployment.name
    assert a.placed is not None
    assert a.placed.reason is Reason.AFFINITY
    sampled(home, 4)
    for t in others:
        sampled(t, 2)
    b = attempt("a question", "a follow-up", "another")
    assert sent(r, b) != home.deployment.name
    assert b.placed is not None
    assert b.placed.reason is Reason.OVERRIDE


def test_without_metrics_one_attempt_above_the_others_is_not_beyond_the_bound():
    """The gateway's own attempts in flight over the pools' limit: the same rule."""
    clock = FakeClock()
    targets = [target(clock, name) for name in ("a", "b", "c", "d")]
    r = routing("prefix_affinity", targets)
    home = next(t for t in targets if t.deployment.name == sent(r, attempt("a question")))
    for t in targets:
        t.breaker.in_flight = 3 if t is home else 2
    a = attempt("a question", "a follow-up")
    assert sent(r, a) == home.deployment.name
    home.breaker.in_flight = 4
    b = attempt("a question", "a follow-up", "another")
    assert sent(r, b) != home.deployment.name


def test_affinity_holds_while_every_deployment_has_room():
    """Two in flight on the home deployment and none elsewhere is far beyond the mean,
    but the home one starts the request at once and holds its prefix."""
    clock = FakeClock()
    targets = [target(clock, name, metrics=True) for name in ("a", "b")]
    r = routing("prefix_affinity", targets)
    for t in targets:
        sampled(t, 0)
    home = next(t for t in targets if t.deployment.name == sent(r, attempt("hello")))
    sampled(home, 2)
    assert sent(r, attempt("hello", "again")) == home.deployment.name


def test_the_index_keeps_the_most_recently_sent_blocks_within_its_bound():
    clock = FakeClock()
    spec = PrefixAffinity(block_bytes=32, index_blocks=20)
    targets = [target(clock, "a")]
    one = routing("prefix_affinity", [*targets, target(clock, "b")], spec)
    for n in range(30):
        sent(one, attempt(f"conversation {n} " * 20))
    sizes = one.view()["index_blocks"]
    assert all(size <= 20 for size in sizes.values())
    assert sum(sizes.values()) > 20


def test_the_prompt_is_rendered_in_the_order_the_backend_reads_it():
    chat, opening = render(
        Endpoint.CHAT,
        {
            "tools": [{"type": "function"}],
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ],
        },
    )
    assert chat.index(b"function") < chat.index(b"be brief") < chat.index(b"hi")
    assert chat[:opening].endswith(b'hi"}]'), "the opening ends with the first user turn"
    assert render(Endpoint.COMPLETIONS, {"prompt": "once upon"}) == (b"once upon", 9)
    blocks = chained(b"x" * 100, 32)
    assert len(blocks) == 3
    assert chained(b"y" + b"x" * 99, 32)[2] != blocks[2], "each block covers all before it"


def test_tenants_that_isolate_their_cache_never_share_an_index_entry():
    payload = {"messages": [{"role": "system", "content": SYSTEM}]}
    shared = chained(render(Endpoint.CHAT, payload).data, 32)
    one = chained(render(Endpoint.CHAT, payload, "salt-a").data, 32)
    other = chained(render(Endpoint.CHAT, payload, "salt-b").data, 32)
    assert not set(one) & set(other)
    assert not set(one) & set(shared)
