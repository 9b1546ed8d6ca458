from __future__ import annotations

from sluicegate.jobs.sql import POSTGRES, SQLITE, bind, in_list


def test_parameters_are_numbered_once_per_name():
    query = "SELECT * FROM jobs WHERE tenant = :tenant AND id = :id OR tenant = :tenant"
    params = {"id": "j", "tenant": "t", "unused": 1}
    assert bind(query, params, POSTGRES) == (
        "SELECT * FROM jobs WHERE tenant = $1 AND id = $2 OR tenant = $1",
        ["t", "j"],
    )
    assert bind(query, params, SQLITE)[0] == (
        "SELECT * FROM jobs WHERE tenant = ?1 AND id = ?2 OR tenant = ?1"
    )


def test_dialect_words_are_filled_in():
    query = "SELECT id FROM jobs WHERE lease_until <= :now {skip_locked}"
    assert bind(query, {"now": 1.0}, POSTGRES)[0].endswith("$1 FOR UPDATE SKIP LOCKED")
    assert bind(query, {"now": 1.0}, SQLITE)[0].endswith("?1 ")


def test_in_list_has_a_parameter_per_value_and_matches_nothing_when_empty():
    assert in_list("lane", ["a", "b"]) == (
        "lane IN (:lane_0, :lane_1)",
        {"lane_0": "a", "lane_1": "b"},
    )
    assert in_list("lane", []) == ("1 = 0", {})
