"""The traffic of a routing phase, drawn before it starts so every strategy meets the same.

Prompts are random hexadecimal text, four characters a token as the simulator counts:
two prompts share a prefix only where the plan means them to, a system prompt per
application and every earlier turn of a conversation, so a backend's prefix-cache hits
come from routing alone. What a request could have found cached at best (its *ceiling*)
is what the same conversation or application already sent before it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.routing.scenario import Tenant, Traffic

CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Conversation:
    start_s: float
    application: int
    tenant: str
    users: tuple[str, ...]
    """The user's message of each turn."""
    thinks_s: tuple[float, ...]
    """The pause after each answer but the last before the next turn."""


@dataclass(frozen=True, slots=True)
class OneShot:
    start_s: float
    tenant: str
    text: str


@dataclass(frozen=True, slots=True)
class Plan:
    systems: tuple[str, ...]
    """Each application's system prompt."""
    owners: tuple[str, ...]
    """Each application's tenant."""
    conversations: tuple[Conversation, ...]
    one_shots: tuple[OneShot, ...]

    @property
    def requests(self) -> int:
        return sum(len(c.users) for c in self.conversations) + len(self.one_shots)


def text(rng: random.Random, tokens: int) -> str:
    return rng.randbytes(tokens * CHARS_PER_TOKEN // 2).hex()


def applications(seed: int, traffic: Traffic, tenants: Sequence[Tenant]) -> Plan:
    """The applications alone: their system prompts, each owned by a tenant in turn."""
    rng = random.Random(f"{seed}/systems")
    systems = tuple(text(rng, traffic.system_tokens) for _ in range(traffic.applications))
    owners = tuple(tenants[i % len(tenants)].name for i in range(traffic.applications))
    return Plan(systems, owners, (), ())


def conversation(
    rng: random.Random, traffic: Traffic, owners: Sequence[str], start_s: float
) -> Conversation:
    application = rng.randrange(len(owners))
    turns = rng.randint(traffic.turns.low, traffic.turns.high)
    users = tuple(
        text(rng, rng.randint(traffic.user_tokens.low, traffic.user_tokens.high))
        for _ in range(turns)
    )
    thinks = tuple(rng.expovariate(1 / traffic.think_s) for _ in range(turns - 1))
    return Conversation(start_s, application, owners[application], users, thinks)


def one_shot(
    rng: random.Random, traffic: Traffic, tenants: Sequence[Tenant], start_s: float
) -> OneShot:
    tokens = rng.randint(traffic.one_shot_tokens.low, traffic.one_shot_tokens.high)
    return OneShot(start_s, rng.choice(tenants).name, text(rng, tokens))


def build(
    seed: int,
    traffic: Traffic,
    tenants: Sequence[Tenant],
    rate_rps: float,
    duration_s: float,
    shared: bool = True,
) -> Plan:
    """Requests at `rate_rps` on average over `duration_s`: conversations (each turn a
    request) and one-shot requests as Poisson arrivals; `shared: false` sends one-shot
    requests alone at the same rate. Each kind draws from its own stream of the seed."""
    base = applications(seed, traffic, tenants)
    one_share = 1.0 if not shared else traffic.one_shot_share
    conversations: list[Conversation] = []
    rate = (1 - one_share) * rate_rps / traffic.turns.mean
    rng = random.Random(f"{seed}/conversations")
    for start_s in arrivals(rng, rate, duration_s):
        conversations.append(conversation(rng, traffic, base.owners, start_s))
    rng = random.Random(f"{seed}/one-shots/{shared}")
    one_shots = [
        one_shot(rng, traffic, tenants, t) for t in arrivals(rng, one_share * rate_rps, duration_s)
    ]
    return Plan(base.systems, base.owners, tuple(conversations), tuple(one_shots))


def arrivals(rng: random.Random, rate: float, duration_s: float) -> list[float]:
    """Poisson arrival times in [0, duration_s)."""
    times: list[float] = []
    if rate <= 0:
        return times
    now = rng.expovariate(rate)
    while now < duration_s:
        times.append(now)
        now += rng.expovariate(rate)
    return times


def messages(system: str, users: Sequence[str], answers: Sequence[str]) -> list[dict[str, str]]:
    """A turn's chat: the system prompt, then each earlier turn and its answer, then the
    turn's own message (`users` has one more entry than `answers`)."""
    chat = [{"role": "system", "content": system}]
    for user, answer in zip(users, answers, strict=False):
        chat.append({"role": "user", "content": user})
        chat.append({"role": "assistant", "content": answer})
    chat.append({"role": "user", "content": users[len(answers)]})
    return chat


def shared_chars(system: str, users: Sequence[str], answers: Sequence[str], seen: bool) -> int:
    """Of a turn's prompt, the characters its conversation or application sent before:
    every earlier turn with its answer (and the system prompt), or on a first turn the
    system prompt if another conversation of the application came first (`seen`)."""
    if not answers:
        return len(system) if seen else 0
    return len(system) + sum(len(u) + len(a) for u, a in zip(users, answers, strict=False))
