"""Which addresses count as loopback, and when serving without a master key is refused or warned about."""

from __future__ import annotations

import logging

import pytest

from proxy.kernel.config import ConfigError, Settings
from proxy.process.exposure import check_exposure, is_loopback


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST", "localhost.", "::ffff:127.0.0.1"]
)
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "", "192.0.2.10", "10.0.0.1", "::ffff:10.0.0.1", "proxy.internal", "localhost.evil.com"]
)
def test_everything_else_is_exposed(host: str) -> None:
    assert not is_loopback(host)


def test_exposed_without_a_key_is_refused_naming_what_to_do() -> None:
    with pytest.raises(ConfigError, match="--allow-unauthenticated") as refused:
        check_exposure(Settings(), "0.0.0.0", allow_unauthenticated=False)
    assert "CONTEXT_PROXY_MASTER_KEY" in str(refused.value) and "CONTEXT_PROXY_ALLOW_UNAUTHENTICATED" in str(
        refused.value
    )


def test_a_master_key_allows_any_address_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="context_proxy"):
        check_exposure(Settings(master_key="sk-master"), "0.0.0.0", allow_unauthenticated=False)
    assert caplog.records == []


@pytest.mark.parametrize(
    ("settings", "host", "flag", "warning"),
    [
        (Settings(), "127.0.0.1", False, "without CONTEXT_PROXY_MASTER_KEY"),
        (Settings(), "0.0.0.0", True, "WITHOUT authentication"),
        (Settings(allow_unauthenticated=True), "0.0.0.0", False, "WITHOUT authentication"),
    ],
)
def test_serving_without_a_key_is_always_logged(
    caplog: pytest.LogCaptureFixture, settings: Settings, host: str, flag: bool, warning: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="context_proxy"):
        check_exposure(settings, host, allow_unauthenticated=flag)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert warning in caplog.records[0].getMessage()


def test_the_environment_switch_is_read_as_a_flag() -> None:
    assert Settings.from_env({"CONTEXT_PROXY_ALLOW_UNAUTHENTICATED": "1"}).allow_unauthenticated
    assert not Settings.from_env({}).allow_unauthenticated
    with pytest.raises(ConfigError, match="CONTEXT_PROXY_ALLOW_UNAUTHENTICATED"):
        Settings.from_env({"CONTEXT_PROXY_ALLOW_UNAUTHENTICATED": "maybe"})
