"""The built-in contributors declare ``runs_inline``: their ``contribute`` must finish without awaiting.

The collector runs such a contributor in the pipeline's own task, one after another and without a timer
(``proxy/context/collector.py``). A built-in that came to await something (a store read, a sleep) would
then hold up the others with no timeout: this fails first, naming it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from contributors.base import BuiltinContributor
from proxy.context.registry import ContextContributorRegistry, configure, discover_factories
from proxy.context.types import SCOPES, ContributionRequest


def _histories(tool_step: Callable[..., list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    plan = {"steps": [{"id": "s1", "title": "Measure", "status": "in_progress"}]}
    return [
        [],
        [
            {"role": "system", "content": "You are a lab assistant."},
            {"role": "user", "content": "Plan the assay."},
            *tool_step("c1", "update_plan", plan, json.dumps({"ok": True})),
            *tool_step("c2", "run_assay", {"sample": 1}, "absorbance 0.41"),
            {"role": "assistant", "content": "Done."},
        ],
    ]


@pytest.mark.parametrize("scope", SCOPES)
def test_every_builtin_declares_runs_inline_and_contributes_without_awaiting(
    scope: Any, tool_step: Callable[..., list[dict[str, Any]]]
) -> None:
    registry = ContextContributorRegistry(scope, configure(discover_factories(), {}))
    assert len(registry) > 0
    for contributor in registry:
        assert isinstance(contributor, BuiltinContributor) and contributor.runs_inline, contributor.id
        for history in _histories(tool_step):
            request = ContributionRequest(
                scope=scope, context_id="ctx", history=history, options=registry.options_of(contributor.id)
            )
            step = contributor.contribute(request)
            try:
                step.send(None)  # one step of the coroutine: it must return, not suspend
            except StopIteration:
                continue
            step.close()
            pytest.fail(f"the built-in contributor {contributor.id!r} awaited something in scope {scope!r}")
