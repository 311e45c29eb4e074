"""Which calls go through ``litellm.acompletion`` rather than the provider fast path (``proxy/provider/fast``),
and what litellm's stream wrapper builds at a stream's end."""

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


def count_stream_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many chunks each call of litellm's ``stream_chunk_builder`` (the answer a stream's wrapper rebuilds
    at its end) is given, by acompletion's wrapper or the fast path's; set it before the fast path is made
    (a proxy started after it), which takes the builder then."""
    import litellm

    counts: list[int] = []
    builder = litellm.stream_chunk_builder

    def counted(**arguments: Any) -> Any:
        counts.append(len(arguments["chunks"]))
        return builder(**arguments)

    monkeypatch.setattr(litellm, "stream_chunk_builder", counted)
    return counts
