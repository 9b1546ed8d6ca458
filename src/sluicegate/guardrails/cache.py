"""Recent checker verdicts, so the same text is not sent to a slow classifier twice.

Keys are an HMAC of (guardrail, config version, stage, text) under a secret the process
draws at start: the text itself is never stored, and a key read out of memory tells
nothing about the text without the secret. A verdict holds offsets and kinds only.
Entries live `ttl_s` and the cache holds at most `size` of them, the least recently
used leaving first.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict

from sluicegate.core.clock import Clock
from sluicegate.guardrails.checker import Stage, Verdict


class DecisionCache:
    __slots__ = ("_clock", "_entries", "_prefix", "_secret", "_size", "_ttl_s")

    def __init__(
        self, clock: Clock, secret: bytes, guardrail: str, version: str, ttl_s: float, size: int
    ) -> None:
        self._clock = clock
        self._secret = secret
        self._prefix = f"{guardrail}\0{version}\0".encode()
        self._ttl_s = ttl_s
        self._size = size
        self._entries: OrderedDict[bytes, tuple[float, Verdict]] = OrderedDict()

    @property
    def on(self) -> bool:
        return self._ttl_s > 0 and self._size > 0

    def key(self, text: str, stage: Stage) -> bytes:
        message = self._prefix + stage.value.encode() + b"\0" + text.encode("utf-8", "replace")
        return hmac.digest(self._secret, message, hashlib.sha256)

    def get(self, key: bytes) -> Verdict | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_s, verdict = entry
        if self._clock.now() >= expires_s:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return verdict

    def put(self, key: bytes, verdict: Verdict) -> None:
        entries = self._entries
        entries[key] = (self._clock.now() + self._ttl_s, verdict)
        entries.move_to_end(key)
        while len(entries) > self._size:
            entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
