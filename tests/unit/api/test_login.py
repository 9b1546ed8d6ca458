"""Login tokens: issued for an admin key alone, valid until their expiry, refused when
tampered with or signed by a key the gateway does not hold, compared in constant time."""

from __future__ import annotations

import hashlib

import pytest

from sluicegate.api import login
from sluicegate.api.login import Logins
from tests.support.clock import FakeClock

ADMIN = b"sk-admin"
OTHER = b"sk-other-admin"


def digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def logins(clock: FakeClock, *keys: bytes) -> Logins:
    return Logins([digest(k) for k in keys or (ADMIN,)], clock, ttl_s=3600)


def test_an_admin_key_gets_a_token_valid_until_its_expiry():
    clock = FakeClock(start=1_000_000.0)
    issuer = logins(clock)
    token = issuer.issue(ADMIN)
    assert token is not None
    assert issuer.expiry(token) == 1_003_600
    clock.advance(3599.0)
    assert issuer.expiry(token) == 1_003_600
    clock.advance(1.0)
    assert issuer.expiry(token) is None


def test_a_key_that_is_not_an_admin_key_gets_no_token():
    issuer = logins(FakeClock())
    assert issuer.issue(b"sk-tenant") is None
    assert issuer.issue(b"") is None


def test_every_worker_holding_the_key_verifies_the_token_without_shared_state():
    clock = FakeClock(start=5000.0)
    token = logins(clock).issue(ADMIN)
    assert token is not None
    assert logins(clock, OTHER, ADMIN).expiry(token) == 8600


def test_a_token_signed_by_a_key_this_gateway_does_not_hold_is_refused():
    clock = FakeClock(start=5000.0)
    token = logins(clock, OTHER).issue(OTHER)
    assert token is not None
    assert logins(clock).expiry(token) is None


@pytest.mark.parametrize(
    "tamper",
    [
        lambda t: b"9" + t,  # a later expiry
        lambda t: t.replace(b".", b".0", 1),  # the same expiry, written otherwise
        lambda t: t[:-1] + (b"0" if t[-1:] != b"0" else b"1"),  # the MAC
        lambda t: t.split(b".")[0] + b".0." + t.split(b".")[2],  # the nonce
        lambda t: t + b".x",
        lambda t: t.rpartition(b".")[0],
        lambda t: b"",
        lambda t: t + b"0" * 200,
    ],
)
def test_a_tampered_token_is_refused(tamper):
    clock = FakeClock(start=5000.0)
    issuer = logins(clock)
    token = issuer.issue(ADMIN)
    assert token is not None
    assert issuer.expiry(tamper(token)) is None


def test_two_tokens_differ_by_their_nonce():
    issuer = logins(FakeClock(start=5000.0))
    assert issuer.issue(ADMIN) != issuer.issue(ADMIN)


def test_macs_are_compared_in_constant_time(monkeypatch):
    compared: list[tuple[bytes, bytes]] = []
    real = login.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(login, "compare_digest", recording)
    issuer = logins(FakeClock(start=5000.0))
    token = issuer.issue(ADMIN)
    assert token is not None
    compared.clear()
    assert issuer.expiry(token) is not None
    assert compared
    assert compared[-1][1] == token.rpartition(b".")[2]
