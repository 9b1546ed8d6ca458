from sluicegate.core.types import Deployment, Model, Price, Timeouts
from sluicegate.spend.prices import (
    MAX_TOKENS,
    NANOS,
    Usage,
    clamped,
    cost_nanos,
    estimate_nanos,
    most_per_token,
)

PRICE = Price(input=2.0, cached_input=0.5, output=8.0, batch_discount=0.5)


def deployment(name: str, price: Price | None) -> Deployment:
    timeouts = Timeouts(1.0, 1.0, 1.0)
    return Deployment(name, "openai", "http://x", "m", None, timeouts, 1, (name,), price=price)


def test_a_million_tokens_cost_the_price_in_dollars():
    assert cost_nanos(PRICE, Usage(1_000_000, 0, 0), False) == 2 * NANOS
    assert cost_nanos(PRICE, Usage(0, 0, 1_000_000), False) == 8 * NANOS


def test_cached_prompt_tokens_are_priced_apart():
    # 100 fresh at 2, 900 cached at 0.5, 10 out at 8 ($/M): 200 + 450 + 80 = 730 µ$.
    assert cost_nanos(PRICE, Usage(1000, 900, 10), False) == 730_000


def test_jobs_get_the_batch_discount():
    assert cost_nanos(PRICE, Usage(1000, 0, 0), True) == 1000 * 2 * 1000 // 2


def test_a_cost_is_rounded_up_never_down():
    cheap = Price(input=0.0001, cached_input=0.0001, output=0.0)
    assert cost_nanos(cheap, Usage(1, 0, 0), False) == 1


def test_lying_usage_is_clamped():
    assert clamped(-5, 3, -1) == Usage(0, 0, 0)
    assert clamped(10, 50, 2) == Usage(10, 10, 2)
    assert clamped(10**12, 0, 10**12).output == MAX_TOKENS


def test_reservations_take_the_highest_prices_of_the_chain():
    dear = Price(input=3.0, cached_input=3.0, output=1.0)
    model = Model("m", (deployment("a", PRICE), deployment("b", dear), deployment("c", None)))
    assert most_per_token(model) == (3.0, 8.0)
    assert estimate_nanos(most_per_token(model), 100, 10) == (300 + 80) * 1000


def test_a_model_without_prices_reserves_nothing():
    assert most_per_token(Model("m", (deployment("a", None),))) == (0.0, 0.0)
