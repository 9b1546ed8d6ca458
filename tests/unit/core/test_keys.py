"""Every limit-store key named in `core/keys.py`: names chosen by whoever writes the
config (tenants, pools, deployments, lanes) can never make one key of another, of
another type (a lease set read as a rate, a budget's part as another budget)."""

from __future__ import annotations

from sluicegate.core import keys

NAMES = ("a", "a:requests", "a:tokens", "a:slots", "a:cool", "a:lapse", "a:learnt", "a:due",
         "a:slots:line", "a:slots:owed", "a%3Arequests", "a%", "%", ":", "")  # fmt: skip


def every_key(name: str) -> list[str]:
    slots = [keys.pool_slots(name), keys.tenant_slots(name), keys.route_slots(name)]
    slots += [keys.backend_in_flight(name)]
    made = [*slots, *(part for slot in slots for part in keys.slot_line(slot))]
    made += [keys.pool_requests(name), keys.pool_tokens(name), keys.pool_cooldown(name)]
    made += [keys.tenant_requests(name), keys.tenant_tokens(name)]
    made += [*keys.prefill_parts(keys.prefill(name)), *keys.fair_shares(name)]
    made.append(keys.circuit(name))
    return made


def test_no_two_names_share_a_key_and_no_name_has_two_keys_alike():
    made = [(key, name) for name in NAMES for key in every_key(name)]
    seen: dict[str, str] = {}
    for key, name in made:
        assert key not in seen, f"{key!r} for {name!r} and for {seen[key]!r}"
        seen[key] = name


def test_plain_names_keep_the_keys_they_had():
    """Names with no separator in them (nearly all) are written as they are: replicas of
    two releases side by side in a rolling deploy keep sharing their limits."""
    assert keys.tenant_requests("team-a") == "{edge}tenant:team-a:requests"
    assert keys.pool_slots("vllm_a.1") == "{pools}pool:vllm_a.1:slots"
    assert keys.prefill("sim") == "{pools}prefill:sim"
