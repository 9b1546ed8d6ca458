"""Logins to the status page: an admin key exchanged once for a token a browser keeps.

A token is `expiry.nonce.mac`: the unix second it lapses, a random nonce, and an
HMAC-SHA256 of the two keyed by the sha256 of the admin key that signed in. Every worker
and replica configured with the same admin keys verifies it without shared state, and
the key itself never travels again after the login form. Whoever can read an admin key's
sha256 can mint tokens, so a config holding `sha256:` admin keys is as secret as the keys.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from hmac import compare_digest
from typing import Protocol

LOGIN_TTL_S = 12 * 3600
"""How long a login lasts: a working day's watch, then the key is asked for again."""

MAX_TOKEN_BYTES = 128
"""Longer than any token `issue` writes; a longer one is refused before any MAC."""

NONCE_BYTES = 16


class WallClock(Protocol):
    def now(self) -> float:
        """Unix seconds: a token outlives the process that issued it."""
        ...


class Logins:
    """Issues and verifies login tokens for the admin keys whose digests it holds."""

    def __init__(
        self, admin_keys: Iterable[bytes], clock: WallClock, ttl_s: int = LOGIN_TTL_S
    ) -> None:
        self._keys = tuple(admin_keys)
        self._clock = clock
        self.ttl_s = ttl_s

    def issue(self, key: bytes) -> bytes | None:
        """A token for the admin key `key`; None when it is not one."""
        digest = hashlib.sha256(key).digest()
        if not any(compare_digest(digest, known) for known in self._keys):
            return None
        expiry = int(self._clock.now()) + self.ttl_s
        signed = b"%d.%s" % (expiry, secrets.token_hex(NONCE_BYTES).encode())
        return signed + b"." + _mac(digest, signed)

    def current(self, expiry: int) -> bool:
        """Whether a token lapsing at `expiry` is still valid."""
        return expiry > self._clock.now()

    def expiry(self, token: bytes) -> int | None:
        """When a valid token lapses (unix seconds); None for one that is malformed,
        expired, or signed by no admin key of this config."""
        if len(token) > MAX_TOKEN_BYTES or token.count(b".") != 2:
            return None
        signed, _, mac = token.rpartition(b".")
        expiry = signed.partition(b".")[0]
        if not expiry.isdigit() or len(expiry) > 12 or not self.current(int(expiry)):
            return None
        found = False
        for digest in self._keys:
            found |= compare_digest(_mac(digest, signed), mac)
        return int(expiry) if found else None


def _mac(digest: bytes, signed: bytes) -> bytes:
    return hmac.new(digest, signed, hashlib.sha256).hexdigest().encode()
