"""Every limit-store key the gateway uses, named in one place.

Keys of one decision share a `{...}` hash tag, so that a Redis Cluster can keep them on
one shard: every pool key carries `{pools}` (one attempt's decision spans all the pools
of its deployment, and pools are shared between deployments), every key of the HTTP
edge's gates carries `{edge}`, and the fleet's own bookkeeping (replicas, shared
circuits) carries `{fleet}`.

A name from the config (a tenant, pool, deployment or lane) is written with `%` and `:`
escaped (`_name`), so that no name can spell another key: a tenant `a:requests` would
otherwise own the lease set that is tenant `a`'s request rate. Names without either,
nearly all, are written as they are, so the layout needs no new version for them.
"""

from __future__ import annotations

EDGE = "{edge}"
POOLS = "{pools}"
FLEET = "{fleet}"


def _name(name: str) -> str:
    return name.replace("%", "%25").replace(":", "%3A")


def pool_slots(pool: str) -> str:
    return f"{POOLS}pool:{_name(pool)}:slots"


def slot_line(slot: str) -> tuple[str, str]:
    """A shared slot's waiting line across replicas (who waits, since when) and the slots
    set aside for its heads (who, until when): the same hash tag as the slot."""
    return f"{slot}:line", f"{slot}:owed"


def pool_requests(pool: str) -> str:
    return f"{POOLS}pool:{_name(pool)}:requests"


def pool_tokens(pool: str) -> str:
    return f"{POOLS}pool:{_name(pool)}:tokens"


def backend_in_flight(deployment: str) -> str:
    """Attempts in flight to a deployment's backend, fleet-wide: one of its pools' slots."""
    return f"{POOLS}backend:{_name(deployment)}"


def prefill(deployment: str) -> str:
    """A deployment's prefill budget (`core.prefill`): its prompts awaiting their first
    token, whoever sent them."""
    return f"{POOLS}prefill:{_name(deployment)}"


def prefill_parts(budget: str) -> tuple[str, str, str, str]:
    """A prefill budget as a shared store keeps it: each prompt's tokens (under the
    budget's own key, which is what its release announces), when each lapses, what was
    learnt, and when each must have its first token by; the same hash tag as the
    budget."""
    return budget, f"{budget}:lapse", f"{budget}:learnt", f"{budget}:due"


def pool_cooldown(pool: str) -> str:
    return f"{POOLS}pool:{_name(pool)}:cool"


def route_slots(route: str) -> str:
    return f"{EDGE}route:{_name(route)}"


def tenant_slots(tenant: str) -> str:
    return f"{EDGE}tenant:{_name(tenant)}"


def tenant_requests(tenant: str) -> str:
    return f"{EDGE}tenant:{_name(tenant)}:requests"


def tenant_tokens(tenant: str) -> str:
    return f"{EDGE}tenant:{_name(tenant)}:tokens"


AGGREGATE_SLOTS = f"{EDGE}aggregate"
AGGREGATE_REQUESTS = f"{EDGE}aggregate:requests"
AGGREGATE_TOKENS = f"{EDGE}aggregate:tokens"

REPLICAS = f"{FLEET}replicas"
RELEASED = f"{FLEET}released"
"""The channel on which freed slots are announced."""


def fair_shares(lane: str) -> tuple[str, str, str, str]:
    """A lane's fleet-wide virtual counters, the flows waiting anywhere, and each flow's
    requests held (in flight or queued) on each replica (who, and how many)."""
    root = f"{FLEET}fair:{_name(lane)}"
    return f"{root}:counters", f"{root}:waiting", f"{root}:flying", f"{root}:flying_counts"


def circuit(deployment: str) -> str:
    return f"{FLEET}circuit:{_name(deployment)}"
