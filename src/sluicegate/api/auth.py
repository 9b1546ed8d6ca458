"""Who is calling: bearer keys are hashed and looked up, never compared or kept in clear."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from sluicegate.api.asgi import Scope, header
from sluicegate.core.errors import ErrorType, GatewayError
from sluicegate.core.types import Tenant


class Authenticator:
    """The tenant of a request's bearer key, or a 401."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[bytes, Tenant]) -> None:
        self._keys = keys

    def __call__(self, scope: Scope) -> Tenant:
        digest = key_digest(scope)
        if digest is None:
            raise unauthorised("missing API key: send 'Authorization: Bearer <key>'")
        tenant = self._keys.get(digest)
        if tenant is None:
            raise unauthorised("invalid API key")
        return tenant


def key_digest(scope: Scope) -> bytes | None:
    """sha256 of the bearer key: keys are compared (and kept) only as digests."""
    value = header(scope, b"authorization")
    if value is None or value[:7].lower() != b"bearer ":
        return None
    return hashlib.sha256(value[7:].strip()).digest()


def unauthorised(message: str) -> GatewayError:
    return GatewayError(
        401, "invalid_api_key", message, ErrorType.AUTHENTICATION, should_retry=False
    )
