"""Fixtures for the built-in contributors: run them through the real registry and collector."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from proxy.context.collector import Collection, collect_detailed
from proxy.context.registry import ContextContributorRegistry, configure, discover_factories
from proxy.context.types import ContributionRequest, Scope

Collect = Callable[..., Awaitable[Collection]]


@pytest.fixture
def collect() -> Collect:
    """``await collect(scope, options=<contributors: section>, **request fields)``: the built-ins' validated
    collection for one call, options validated at composition as at start-up."""

    async def run(scope: Scope = "main", options: dict[str, Any] | None = None, **fields: Any) -> Collection:
        registry = ContextContributorRegistry(scope, configure(discover_factories(), options or {}))
        return await collect_detailed(registry, ContributionRequest(scope=scope, context_id="ctx", **fields))

    return run


@pytest.fixture
def tool_step() -> Callable[..., list[dict[str, Any]]]:
    """``tool_step(call_id, name, arguments, result)``: an assistant call and its result."""

    def make(call_id: str, name: str, arguments: Any, result: str) -> list[dict[str, Any]]:
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        return [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ]

    return make
