"""The proxy's prompt-cache breakpoints on a chat call to an Anthropic route (``proxy/runtime/anthropic_marks.py``)."""

from __future__ import annotations

from proxy.runtime.anthropic_marks import marked_for_anthropic

MARK = {"type": "ephemeral"}


def test_a_marked_tool_message_keeps_its_string_so_its_bytes_do_not_change_when_the_mark_moves_on() -> None:
    """litellm puts a tool message's own ``cache_control`` on its ``tool_result``: a string content stays a
    string, as on the turns the message is not marked (a list there would change the cached prefix)."""
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Run it."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "[tool output compacted: ...] step=1"},
    ]
    marked, _ = marked_for_anthropic(messages, None, (0, 3))
    assert marked[3] == {**messages[3], "cache_control": MARK}
    assert marked[0]["content"] == [{"type": "text", "text": "You are an agent.", "cache_control": MARK}]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "[tool output compacted: ...] step=1"}


def test_the_proxys_marks_stay_and_the_clients_oldest_go_past_four() -> None:
    parts = [{"type": "text", "text": f"part {i}", "cache_control": MARK} for i in range(4)]
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": parts},
        {"role": "tool", "tool_call_id": "c1", "content": "preview"},
    ]
    marked, _ = marked_for_anthropic(messages, None, (0, 2))
    kept = [part for part in marked[1]["content"] if "cache_control" in part]
    assert "cache_control" in marked[2] and "cache_control" in marked[0]["content"][0]
    assert len(kept) == 2 and kept[-1]["text"] == "part 3"  # four in all: the client's newest two stay
