"""Percentiles and Jain's fairness index among backlogged tenants."""

from __future__ import annotations

import math

import pytest

from sluicegate.bench.stats import backlogged_fairness, jain, percentile


def test_percentile_interpolates_between_ranks():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0], 100) == 2.0
    assert math.isnan(percentile([], 99))


def test_jain_is_one_for_equal_shares_and_one_over_n_for_a_monopoly():
    assert jain([5.0, 5.0, 5.0]) == pytest.approx(1.0)
    assert jain([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain([3.0, 1.0]) == pytest.approx(16 / 20)


def test_jain_of_nothing_served_says_nothing():
    assert math.isnan(jain([0.0, 0.0]))


def test_fairness_compares_service_in_bins_where_both_tenants_were_backlogged():
    waiting = {"a": [(0.0, 4.0)], "b": [(0.0, 2.0), (1.5, 4.0)]}
    served = {"a": [(0.0, 4.0, 400.0)], "b": [(0.0, 4.0, 100.0)]}
    found = backlogged_fairness(waiting, served, span_s=4.0, bin_s=1.0)
    assert found.bins == 4
    assert found.index == pytest.approx(jain([100.0, 25.0]))
    assert found.backlogged_s == {"a": 4.0, "b": 4.0}
    assert found.service == {"a": pytest.approx(400.0), "b": pytest.approx(100.0)}


def test_a_tenant_served_as_fast_as_it_asks_is_not_backlogged():
    waiting = {"a": [(0.0, 3.0)], "b": [(0.2, 0.3), (1.2, 1.3), (2.2, 2.3)]}
    served = {"a": [(2.5, 3.0, 10.0)], "b": [(0.3, 0.9, 50.0), (1.3, 1.9, 50.0)]}
    found = backlogged_fairness(waiting, served, span_s=3.0, bin_s=1.0)
    assert found.bins == 0
    assert math.isnan(found.index)
    assert found.backlogged_s == {"a": 3.0, "b": 0.0}


def test_a_gap_in_the_backlog_leaves_the_bin_out():
    waiting = {"a": [(0.0, 2.0)], "b": [(0.0, 0.5), (0.6, 2.0)]}
    served = {"a": [(1.0, 2.0, 10.0)], "b": [(1.0, 2.0, 10.0)]}
    found = backlogged_fairness(waiting, served, span_s=2.0, bin_s=1.0)
    assert found.bins == 1
    assert found.index == pytest.approx(1.0)


def test_window_fairness_sums_the_bins_where_every_tenant_was_backlogged():
    waiting = {"a": [(0.0, 4.0)], "b": [(0.0, 2.0), (1.5, 3.0)]}
    served = {"a": [(0.0, 4.0, 400.0)], "b": [(0.0, 2.0, 100.0), (2.0, 3.0, 300.0)]}
    found = backlogged_fairness(waiting, served, span_s=4.0, bin_s=1.0)
    assert found.all_backlogged == {"a": pytest.approx(300.0), "b": pytest.approx(400.0)}
    assert found.window_index == pytest.approx(jain([300.0, 400.0]))
