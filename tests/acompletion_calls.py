"""Which calls go through ``litellm.acompletion`` rather than the provider fast path (``proxy/provider/fast``)."""

from __future__ import annotations

from typing import Any

import pytest


def count_acompletion(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models of the calls that go through ``litellm.acompletion`` (the real one, counted)."""
    import litellm

    models: list[str] = []
    real = litellm.acompletion

    async def counted(**arguments: Any) -> Any:
        models.append(arguments["model"])
        return await real(**arguments)

    monkeypatch.setattr(litellm, "acompletion", counted)
    return models
