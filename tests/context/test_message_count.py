"""The message-count cap: whole units, oldest first, the minimum always kept."""

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.message_count import apply_message_count_cap


def turn(i: int, kind: str) -> list[dict[str, Any]]:
    if kind == "tools":
        calls = [{"id": f"c{i}a", "type": "function"}, {"id": f"c{i}b", "type": "function"}]
        return [
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": f"c{i}a", "content": "a"},
            {"role": "tool", "tool_call_id": f"c{i}b", "content": "b"},
        ]
    return [{"role": kind, "content": f"{kind} {i}"}]


histories = st.lists(st.sampled_from(["user", "assistant", "tools"]), max_size=30).map(
    lambda kinds: [{"role": "user", "content": "task"}] + [m for i, k in enumerate(kinds) for m in turn(i, k)]
)


@settings(max_examples=50, deadline=None)
@given(histories, st.integers(1, 40))
def test_cap_keeps_whole_units_and_minimum(history: list[dict[str, Any]], cap: int) -> None:
    out = apply_message_count_cap(history, cap)
    kept = list(out.kept_indices)
    assert list(out.messages) == [history[i] for i in kept]
    assert 0 in kept  # task anchor
    last_assistant = max((i for i, m in enumerate(history) if m["role"] == "assistant"), default=len(history) - 1)
    assert set(range(last_assistant, len(history))) <= set(kept)
    minimum = 1 + len(history) - last_assistant if last_assistant > 0 else len(history)
    assert len(kept) <= max(cap, minimum)
    for i in kept:  # results never lose their call and vice versa
        for c in history[i].get("tool_calls") or []:
            assert any(history[j].get("tool_call_id") == c["id"] for j in kept)
        if history[i]["role"] == "tool":
            assert any(c["id"] == history[i]["tool_call_id"] for j in kept for c in history[j].get("tool_calls") or [])
    assert out.dropped_messages == len(history) - len(kept)


def test_no_cap_or_under_cap_is_identity() -> None:
    history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    assert apply_message_count_cap(history, None).messages == tuple(history)
    assert apply_message_count_cap(history, 5).dropped_messages == 0


def test_drops_oldest_first() -> None:
    history = [{"role": "user", "content": "task"}] + [m for i in range(5) for m in turn(i, "user")]
    history.append({"role": "assistant", "content": "last"})
    out = apply_message_count_cap(history, 4)
    assert [m["content"] for m in out.messages] == ["task", "user 3", "user 4", "last"]
    assert [d.code for d in out.diagnostics] == ["message_cap_dropped"]


def test_minimum_over_cap_is_kept_with_a_warning() -> None:
    history = [{"role": "user", "content": "task"}, *turn(1, "tools"), {"role": "user", "content": "next"}]
    out = apply_message_count_cap(history, 2)
    assert len(out.messages) == 5
    assert out.diagnostics[0].code == "message_cap_minimum"
