"""Splitting history into atomic units."""

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.units import SplitMemo, Unit, anchor_stop, anchor_unit, call_ids, latest_step_start, split_units
from proxy.kernel.canonical import chain_hashes

CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}, {"id": "b"}],
}


def test_call_and_its_results_are_one_unit_others_single() -> None:
    history = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        CALL,
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "tool", "tool_call_id": "zz", "content": "stray"},
        {"role": "assistant", "content": "done"},
    ]
    units = split_units(history)
    assert units == [
        Unit(0, 1, "pinned"),
        Unit(1, 2, "message"),
        Unit(2, 5, "tool_step"),
        Unit(5, 6, "orphan_result"),
        Unit(6, 7, "message"),
    ]
    assert anchor_unit(history, units) == 1
    assert latest_step_start(history, units) == 4


def test_missing_results_make_a_step_unfinished() -> None:
    history = [{"role": "user", "content": "u"}, CALL, {"role": "tool", "tool_call_id": "a", "content": "A"}]
    (_, step) = split_units(history)
    assert step.unfinished and step.missing == ("b",) and len(step) == 2


def test_legacy_function_call() -> None:
    history = [
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": "r"},
    ]
    assert call_ids(history[0]) == ["function_call"]
    assert split_units(history) == [Unit(0, 2, "tool_step")]


def test_no_assistant_latest_is_last_unit_and_no_user_no_anchor() -> None:
    history = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    units = split_units(history)
    assert latest_step_start(history, units) == 1
    assert anchor_unit([{"role": "assistant", "content": "x"}], split_units([{"role": "assistant"}])) is None


_ROLES = ["system", "developer", "user", "assistant", "assistant_call", "tool", "function"]


def _history_of(roles: list[str], rng: Any, reach: int = 1) -> list[dict[str, Any]]:
    """A history of ``roles``; a tool result answers a call of the step ``reach`` steps back at most."""
    history: list[dict[str, Any]] = []
    for k, role in enumerate(roles):
        if role == "assistant_call":
            calls = [{"id": f"c{k}_{j}", "type": "function"} for j in range(rng.randint(1, 2))]
            history.append({"role": "assistant", "content": None, "tool_calls": calls})
        elif role == "tool":
            back = 1 if reach == 1 else rng.randint(1, reach)
            history.append({"role": "tool", "tool_call_id": f"c{k - back}_{rng.randint(0, 1)}", "content": "r"})
        else:
            history.append({"role": role, "content": "x"})
    return history


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_ROLES), max_size=30), st.randoms())
def test_anchor_stop_is_where_the_anchor_unit_ends(roles: list[str], rng: Any) -> None:
    # The compactor finds the task anchor without splitting the history (anchor_stop).
    history = _history_of(roles, rng)
    units = split_units(history)
    anchor = anchor_unit(history, units)
    expected = units[anchor].stop if anchor is not None else 0
    assert anchor_stop(history) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(_ROLES), min_size=1, max_size=40), st.lists(st.integers(0, 40), max_size=6), st.randoms()
)
def test_a_split_memo_splits_every_history_as_split_units_does(roles: list[str], cuts: list[int], rng: Any) -> None:
    # Turns of one session: prefixes of one history (in any order: growing, rewinding, repeating), and a
    # fork that shares a prefix; a step's results may arrive only in a later turn.
    history = _history_of(roles, rng, reach=2)
    fork = [*history[: len(history) // 2], {"role": "user", "content": "fork"}]
    memo = SplitMemo(max_units=30)
    for cut in [*cuts, len(history)]:
        for messages in (history[: max(1, min(cut, len(history)))], fork):
            copies = [dict(m) for m in messages]  # each turn decodes its messages afresh
            assert memo.split(copies, chain_hashes(copies)) == split_units(copies)
