"""Run state as the proxy derives it: with the channels the built-in contributors declare."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.context import state
from proxy.context.registry import configure, discover_factories, state_channels


def builtin_config(options: Mapping[str, Any] | None = None) -> state.StateConfig:
    """The state config of every installed built-in, with the given ``contributors:`` options."""
    return state.StateConfig(state_channels(configure(discover_factories(), options or {})))


def derive_state(
    history: Sequence[Mapping[str, Any]],
    config: state.StateConfig | None = None,
    visible: Sequence[Mapping[str, Any]] | None = None,
) -> state.RunState:
    """``proxy.context.state.derive_state`` with the built-ins' channels by default."""
    return state.derive_state(history, config or builtin_config(), visible)
