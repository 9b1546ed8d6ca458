"""Prices and budgets in the config: parsed into money once, each bad field named."""

import pytest

from sluicegate.config import ConfigError
from sluicegate.core.types import Period, Price, WhenDown
from tests.config.test_config import base, parse


def with_spend(**spend) -> dict:
    raw = base()
    raw["models"][0]["deployments"][0]["price"] = {"input": 2.5, "output": 10}
    unpriced = {"name": "sim-e", "base_url": "${SIM_URL}", "model": "e"}
    raw["models"].append({"name": "embed", "deployments": [unpriced]})
    return raw | {"spend": spend}


def test_prices_and_budgets_are_parsed_once_into_nanodollars():
    budget = {"tenant": "alice", "amount": 12.5, "period": "daily", "model": "chat"}
    settings = parse(with_spend(budgets=[budget], time_zone="Europe/Paris"))
    [deployment] = settings.models["chat"].deployments
    assert deployment.price == Price(2.5, 2.5, 10.0, 0.0)
    [parsed] = settings.spend.budgets
    assert (parsed.amount_nanos, parsed.period, parsed.model) == (
        12_500_000_000,
        Period.DAILY,
        "chat",
    )
    assert parsed.soft == 0.8
    assert settings.spend.time_zone == "Europe/Paris"
    assert settings.spend.when_down is WhenDown.FAIL_CLOSED
    assert settings.spend.priced(settings.models)


def test_a_budget_without_any_price_counts_nothing_and_is_refused():
    raw = base() | {"spend": {"budgets": [ALICE]}}
    with pytest.raises(ConfigError) as info:
        parse(raw)
    assert "spend.budgets[0]: no price is set on any deployment" in str(info.value)


def test_nothing_priced_and_no_budget_means_nothing_to_count():
    settings = parse(base())
    assert settings.models["chat"].deployments[0].price is None
    assert not settings.spend.priced(settings.models)


ALICE = {"tenant": "alice", "amount": 1}


@pytest.mark.parametrize(
    ("spend", "expected"),
    [
        ({"time_zone": "Mars/Olympus"}, "spend.time_zone: unknown time zone 'Mars/Olympus'"),
        (
            {"budgets": [{"tenant": "alicia", "amount": 1}]},
            "spend.budgets[0] names unknown tenant 'alicia'; did you mean 'alice'?",
        ),
        (
            {"budgets": [{**ALICE, "model": "chatt"}]},
            "spend.budgets[0] names unknown model 'chatt'",
        ),
        ({"budgets": [{**ALICE, "amount": 0}]}, "spend.budgets[0].amount"),
        ({"budgets": [{**ALICE, "period": "weekly"}]}, "spend.budgets[0].period"),
        ({"budgets": [{**ALICE, "soft": 1.5}]}, "spend.budgets[0].soft"),
        ({"budgets": [ALICE, ALICE]}, "spend.budgets[1]: a second monthly budget"),
        ({"when_down": "local_share"}, "spend.when_down"),
        (
            {"budgets": [{**ALICE, "model": "embed"}]},
            "spend.budgets[0]: no price is set on its model's deployments",
        ),
    ],
)
def test_each_bad_spend_field_is_named(spend, expected):
    with pytest.raises(ConfigError) as info:
        parse(with_spend(**spend))
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("price", "expected"),
    [
        ({"input": -1, "output": 1}, "price.input"),
        ({"input": 1}, "price.output"),
        ({"input": 1, "output": 1, "batch_discount": 1}, "price.batch_discount"),
        ({"input": 1, "output": float("nan")}, "price.output"),
    ],
)
def test_each_bad_price_is_named(price, expected):
    raw = base()
    raw["models"][0]["deployments"][0]["price"] = price
    with pytest.raises(ConfigError) as info:
        parse(raw)
    assert expected in str(info.value)


def test_fleet_budgets_need_the_durable_record_of_a_jobs_section():
    raw = with_spend(budgets=[{"tenant": "alice", "amount": 1}])
    raw |= {"store": "redis", "redis": {"url": "redis://127.0.0.1:6379"}}
    with pytest.raises(ConfigError) as info:
        parse(raw)
    assert "spend.budgets with store 'redis' need a jobs section" in str(info.value)
    parse(raw | {"jobs": {}})
