"""`prefix_affinity`: the deployment that already holds this conversation's prompt.

A backend with prefix caching skips the prefill of a prompt's leading blocks it still
holds in KV cache, so a conversation sent back where its earlier turns went, or an
application's long system prompt sent where it was sent before, starts sooner and
frees the engine sooner. The gateway needs no help from the backend to aim for that:
it renders the prompt as the backend sees it (tools, then each message's role and
text, in order), cuts it into fixed-size blocks chained by hash (a block's hash covers
everything before it, as the backend's own block cache does), and remembers per
deployment the blocks it recently sent there, at most `index_blocks` of them, the
least recently sent forgotten first.

A conversation goes back where it went: each deployment's index holds, beside the
blocks, the hash of each prompt's opening (up to the end of its first message that is
not the system's), which every turn of a conversation shares; where several hold it,
the one with the longest run of matching leading blocks comes first. Conversations of
one application share only its system prompt, which each deployment caches after one
of them: they spread instead of piling onto the deployment that saw the application
first. A prompt whose opening no deployment holds goes where the opening hashes to
(highest random weight over the deployments' names), which every gateway replica and
worker computes alike: a fleet sends a new conversation to one place and then finds it
there, without sharing its indexes.

Affinity yields to load: when the chosen deployment is fuller than `max_load_ratio`
times the mean (`load_of`) and also more than one request's share of its batch above
that mean (`slot_of`), the least loaded one comes first instead. Both, because load is
counted in batch slots and moves a whole slot per request: on a small batch, or on a
fleet whose mean is low, a ratio alone is crossed by a deployment one request above
the others, which is the ordinary jitter of arrivals and of sends since the last
scrape, not an imbalance. Yielding there moves a turn away from the only deployment
that holds its conversation, so it pays the whole prefill of the conversation to save
the wait for one request's share of a batch step: the wrong trade, made most often at
the loads where affinity matters most. A ratio still governs a full fleet, where its
slack is many requests wide; the slot governs where it is not. The slack grows as the
batch shrinks, without a second setting to tune. Below a quarter of a batch on average
(`QUIET`) every deployment starts a request at once, and the held prefix is worth more
than any spread.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from sluicegate.core.types import Endpoint
from sluicegate.core.types import PrefixAffinity as Spec
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.placement import Placed, Reason, load_of, slot_of

QUIET = 0.25
"""The mean load below which affinity never yields: the deployments have room."""
SEPARATOR = b"\x1e"
"""Between rendered parts, so that two prompts whose parts split differently differ."""


class Prompt:
    """A prompt's opening and block hashes, and how many leading blocks each deployment
    held."""

    __slots__ = ("blocks", "held", "opening")

    def __init__(self, opening: bytes, blocks: list[bytes], held: dict[str, int]) -> None:
        self.opening = opening
        self.blocks = blocks
        self.held = held


class Rendered(NamedTuple):
    data: bytes
    """The prompt as the backend reads it."""
    opening: int
    """How many of its bytes run to the end of its first message that is not the
    system's (all of them for a completion prompt)."""


class PrefixAffinity:
    name = "prefix_affinity"

    def __init__(self, targets: Sequence[Target], spec: Spec) -> None:
        self._spec = spec
        self._index: dict[str, OrderedDict[bytes, None]] = {
            t.deployment.name: OrderedDict() for t in targets
        }
        self._names = {t.deployment.name: t.deployment.name.encode() for t in targets}
        self._blocks_sent = 0
        self._blocks_held = 0
        """Blocks of the prompts sent, and of those the chosen deployment held: the
        gateway's estimate of the backends' prefix-cache hit ratio."""

    def order(self, targets: Sequence[Target], attempt: Attempt) -> tuple[list[Target], Placed]:
        call = attempt.call
        rendered = render(call.endpoint, call.payload, call.tenant.cache_salt)
        opening = hashlib.blake2b(rendered.data[: rendered.opening], digest_size=16).digest()
        blocks = chained(rendered.data, self._spec.block_bytes)
        held = {t.deployment.name: self._held(t.deployment.name, blocks) for t in targets}
        loads = {t.deployment.name: load_of(t) for t in targets}
        seen = [t for t in targets if opening in self._index[t.deployment.name]]
        if seen:
            chosen = max(seen, key=lambda t: held[t.deployment.name])
            reason = Reason.AFFINITY
        else:
            chosen = max(targets, key=lambda t: self._weight(opening, t.deployment.name))
            reason = Reason.HASH
        mean = max(QUIET, sum(loads.values()) / len(loads))
        if self._beyond(loads[chosen.deployment.name], mean, slot_of(chosen)):
            ordered = sorted(targets, key=lambda t: loads[t.deployment.name])
            reason = Reason.OVERRIDE
        else:
            rest = sorted(
                (t for t in targets if t is not chosen), key=lambda t: loads[t.deployment.name]
            )
            ordered = [chosen, *rest]
        prompt = Prompt(opening, blocks, held)
        return ordered, Placed(ordered[0].deployment.name, reason, prompt)

    def placed(self, attempt: Attempt, target: Target, placed: Placed) -> None:
        """Remember the prompt's blocks as held where it went."""
        prompt = placed.key
        if not isinstance(prompt, Prompt):
            return
        name = target.deployment.name
        index = self._index[name]
        for block in (prompt.opening, *prompt.blocks):
            index[block] = None
            index.move_to_end(block)
        while len(index) > self._spec.index_blocks:
            index.popitem(last=False)
        self._blocks_sent += len(prompt.blocks)
        self._blocks_held += prompt.held.get(name, 0)

    def view(self) -> dict[str, Any]:
        sent = self._blocks_sent
        return {
            "index_blocks": {name: len(index) for name, index in self._index.items()},
            "estimated_hit_ratio": self._blocks_held / sent if sent else None,
            "blocks_sent": sent,
        }

    def _beyond(self, load: float, mean: float, slot: float) -> bool:
        """Whether a deployment at `load` is loaded beyond the bound over a fleet at
        `mean`: past the ratio, and by more than one request's share of its batch."""
        return load > self._spec.max_load_ratio * mean and load - mean > slot

    def _held(self, name: str, blocks: list[bytes]) -> int:
        """How many leading blocks of the prompt `name` was sent lately."""
        index = self._index[name]
        count = 0
        for block in blocks:
            if block not in index:
                break
            count += 1
        return count

    def _weight(self, opening: bytes, name: str) -> bytes:
        """The random weight of a prompt's opening on deployment `name`."""
        return hashlib.blake2b(opening + self._names[name], digest_size=8).digest()


def chained(data: bytes, size: int) -> list[bytes]:
    """The hash of each whole `size`-byte block of `data`, each covering every byte
    before it: a partial last block is never cached by the backend either."""
    hashes = []
    previous = b""
    for start in range(0, len(data) - size + 1, size):
        previous = hashlib.blake2b(previous + data[start : start + size], digest_size=16).digest()
        hashes.append(previous)
    return hashes


def render(endpoint: Endpoint, payload: Mapping[str, Any], salt: str | None = None) -> Rendered:
    """The prompt as the backend reads it, in its order: for chat, the tools and then
    each message's role and content; for completions, the prompt. A tenant's cache salt
    comes first, as the backend keys its cache by it: one tenant's blocks never match
    another's."""
    salted = [] if salt is None else [salt.encode()]
    if endpoint is not Endpoint.CHAT:
        prompt = payload.get("prompt", payload.get("input"))
        text = prompt.encode() if isinstance(prompt, str) else orjson.dumps(prompt)
        data = SEPARATOR.join([*salted, text])
        return Rendered(data, len(data))
    parts: list[bytes] = salted
    tools = payload.get("tools")
    if tools:
        parts.append(orjson.dumps(tools))
    opening = None
    for message in payload.get("messages") or ():
        if not isinstance(message, Mapping):
            continue
        role = str(message.get("role", ""))
        content = message.get("content")
        parts.append(role.encode())
        parts.append(content.encode() if isinstance(content, str) else orjson.dumps(content))
        if opening is None and role != "system":
            opening = len(parts)
    data = SEPARATOR.join(parts)
    if opening is None or opening == len(parts):
        return Rendered(data, len(data))
    return Rendered(data, len(SEPARATOR.join(parts[:opening])))
