"""Memory projection: a short data message and a bounded, untrusted ``memory.snapshot`` attachment."""

from __future__ import annotations

import json

import pytest

from contributors.memory import factory
from proxy.context.hidden import hidden_message
from proxy.context.registry import FactorySource, OptionsInvalid, configure
from tests.builtin_state import derive_state

NONCE = "0123456789abcdef"  # a framing nonce (a session's is 16 hex digits)


def remembered(tool_step, count: int) -> list:
    history: list = []
    for k in range(count):
        history += tool_step(f"m{k}", "remember", {"key": f"fact{k}", "value": "v" * 50}, "stored")
    return history


async def test_snapshot_is_an_untrusted_attachment(collect, tool_step) -> None:
    history = remembered(tool_step, 2)
    collection = await collect(history=history, state=derive_state(history))
    (attachment,) = collection.attachments
    assert (attachment.id, attachment.trust, attachment.source) == ("memory.snapshot", "untrusted_data", "memory")
    lines = [json.loads(line) for line in attachment.content.splitlines()]
    assert [line["arguments"]["key"] for line in lines] == ["fact0", "fact1"]
    assert 'trust="untrusted_data"' in hidden_message(attachment, nonce=NONCE)["content"]
    (message,) = [m for m in collection.messages if m.id == "memory.state"]
    assert "2 entries" in message.content


async def test_snapshot_is_bounded_keeping_the_newest(collect, tool_step) -> None:
    history = remembered(tool_step, 10)
    collection = await collect(history=history, options={"memory": {"max_chars": 300}})
    (attachment,) = collection.attachments
    assert len(attachment.content) <= 300
    keys = [json.loads(line)["arguments"]["key"] for line in attachment.content.splitlines()]
    assert keys and keys[-1] == "fact9" and "fact0" not in keys
    (message,) = [m for m in collection.messages if m.id == "memory.state"]
    assert f"newest {len(keys)}" in message.content


async def test_reviewer_gets_no_memory(collect, tool_step) -> None:
    collection = await collect("reviewer", history=remembered(tool_step, 1))
    assert not collection.attachments


def test_max_chars_must_be_positive() -> None:
    with pytest.raises(OptionsInvalid, match=r"contributors\.memory\.max_chars"):
        configure([FactorySource(factory, "test")], {"memory": {"max_chars": 0}})
