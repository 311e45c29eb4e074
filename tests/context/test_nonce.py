"""The framing nonce: a pure, per-session function of the deployment secret."""

from __future__ import annotations

import re

import pytest

from proxy.context.nonce import NONCE_PATTERN, session_nonce


def test_the_nonce_is_stable_per_session_and_differs_between_sessions_and_secrets() -> None:
    secret = b"s" * 32
    nonce = session_nonce(secret, "run-1")
    assert re.fullmatch(NONCE_PATTERN, nonce)
    assert session_nonce(secret, "run-1") == nonce  # every turn, every replica, after a restart
    assert session_nonce(secret, "run-2") != nonce
    assert session_nonce(b"t" * 32, "run-1") != nonce


def test_an_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        session_nonce(b"", "run-1")
