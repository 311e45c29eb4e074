"""HistoryCompactor: previews first, then a validated, size-checked checkpoint; reuse; forced passes."""

import asyncio
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.checkpoint import Checkpoint, is_checkpoint_message, quote_body
from proxy.context.compactor import (
    OFFLOAD_MESSAGES,
    CompactionConfig,
    CompactionResult,
    HistoryCompactor,
    history_entries,
)
from proxy.context.estimators import CachingEstimator, ConservativeTokenEstimator
from proxy.context.previews import is_preview
from proxy.context.tool_output_reader import read_tool_output
from proxy.context.units import split_units
from proxy.context.working_history import SPLIT_NOTE
from proxy.kernel.canonical import HistoryEntry, content_text

NONCE = "0123456789abcdef"  # a framing nonce (a session's is 16 hex digits)

ESTIMATOR = ConservativeTokenEstimator()
ANCHOR = "Task: find the melting point of compound X and report it with its uncertainty."
GOOD = "## Completed work\n- Ran the first {n} steps.\n## Evidence\n- see ref={ref}\n## Next step\n- Continue the scan."

Reply = str | BaseException | Callable[[list[dict[str, Any]]], str]


class FakeSummarizer:
    """Answers from a script (text, an exception to raise, or a function of the request); records calls."""

    def __init__(self, *script: Reply, default: Reply | None = None) -> None:
        self.script = list(script)
        self.default = default
        self.history: list[list[dict[str, Any]]] = []

    async def summarize(self, messages: list[dict[str, Any]]) -> str:
        self.history.append(messages)
        reply = self.script.pop(0) if self.script else self.default
        if reply is None:
            raise AssertionError("the summarizer was not expected to be called")
        if isinstance(reply, BaseException):
            raise reply
        return reply(messages) if callable(reply) else reply


def good_checkpoint(messages: list[dict[str, Any]]) -> str:
    """A short valid checkpoint citing the first ref the transcript shows (or none)."""
    text = messages[-1]["content"]
    ref = text.split("(ref=", 1)[1].split(")", 1)[0] if "(ref=" in text else "none"
    return GOOD.format(n=text.count("[message "), ref=ref)


def body(step: int, chars: int, fact: str | None = None) -> str:
    lines: list[str] = []
    j = 0
    while sum(len(line) + 1 for line in lines) < chars:
        j += 1
        lines.append(f"step {step} sample {j}: intensity={(step * 31 + j * 7) % 997} counts, drift ok")
    if fact is not None:
        lines.insert(len(lines) // 2, fact)
    return "\n".join(lines)


def agent_run(
    steps: int, chars: int = 4_000, *, refs: bool = True, fact: str | None = None, extra: Sequence[dict[str, Any]] = ()
) -> tuple[list[HistoryEntry], dict[str, str]]:
    """An autonomous run: the task, then ``steps`` tool steps, then ``extra`` messages; and the ref store."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": ANCHOR}]
    ref_at: dict[int, str] = {}
    store: dict[str, str] = {}
    for k in range(1, steps + 1):
        call = {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": "measure", "arguments": json.dumps({"k": k})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        text = body(k, chars, fact if k == 1 else None)
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": text})
        if refs:
            ref_at[len(messages) - 1] = f"to_{k:04d}"
            store[f"to_{k:04d}"] = text
    messages.extend(extra)
    return history_entries(messages, ref_at), store


def cost(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(ESTIMATOR.count_message(m) for m in messages)


def assert_protocol_valid(messages: Sequence[Mapping[str, Any]]) -> None:
    """Every tool call answered right after it; no result without its call."""
    pending: list[str] = []
    for i, message in enumerate(messages):
        if message.get("role") == "tool":
            assert message.get("tool_call_id") in pending, f"orphan tool result at {i}"
            pending.remove(message["tool_call_id"])
            continue
        assert not pending, f"calls {pending} without results before {i}"
        pending = [c["id"] for c in message.get("tool_calls") or ()]
    assert not pending


async def compact(entries: Sequence[HistoryEntry], limit: int, **kw: Any) -> CompactionResult:
    compactor = HistoryCompactor(kw.pop("config", None))
    return await compactor.compact(entries, nonce=NONCE, limit=limit, estimator=ESTIMATOR, **kw)


class GatedEstimator:
    """Counts like ``ESTIMATOR``, but its first message count waits until ``gate`` is opened."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.opened_in_time: bool | None = None
        self.threads: set[int] = set()

    def count_text(self, text: str) -> int:
        return ESTIMATOR.count_text(text)

    def count_message(self, message: Mapping[str, Any]) -> int:
        self.threads.add(threading.get_ident())
        if self.opened_in_time is None:
            # On the event loop this wait could only end by timing out: nothing else runs meanwhile.
            self.opened_in_time = self.gate.wait(timeout=5)
        return ESTIMATOR.count_message(message)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        return ESTIMATOR.count_tools(tools)


async def test_a_large_history_is_counted_while_the_event_loop_serves_others() -> None:
    entries, _ = agent_run(OFFLOAD_MESSAGES // 2 + 1, chars=100)
    estimator = GatedEstimator()

    async def another_session() -> None:
        await asyncio.sleep(0.01)  # compaction has started counting by now
        estimator.gate.set()

    compactor = HistoryCompactor()
    await asyncio.gather(
        compactor.compact(entries, nonce=NONCE, limit=1_000_000, estimator=estimator), another_session()
    )
    assert estimator.opened_in_time is True
    assert threading.get_ident() not in estimator.threads


async def test_a_small_history_is_counted_on_the_event_loop() -> None:
    entries, _ = agent_run(3, chars=100)
    estimator = GatedEstimator()
    estimator.gate.set()
    await HistoryCompactor().compact(entries, nonce=NONCE, limit=1_000_000, estimator=estimator)
    assert estimator.threads == {threading.get_ident()}  # no thread hop for what costs microseconds


async def test_below_the_threshold_nothing_changes() -> None:
    entries, _ = agent_run(4)
    total = cost([e.message for e in entries])
    summarizer = FakeSummarizer()
    result = await compact(entries, limit=total * 2, summarizer=summarizer)
    assert list(result.messages) == [dict(e.message) for e in entries]
    assert result.trace.reason is None and result.trace.tokens_after == total
    assert summarizer.history == [] and result.checkpoint is None


async def test_previews_old_bodies_oldest_first_until_under_target() -> None:
    entries, _ = agent_run(10)
    total = cost([e.message for e in entries])
    limit = int(total / 0.85)  # over the 80 % threshold
    summarizer = FakeSummarizer()  # previews alone suffice: never called
    result = await compact(entries, limit=limit, summarizer=summarizer)
    trace = result.trace
    assert trace.reason == "pressure"
    assert trace.compacted_refs == [f"to_{k:04d}" for k in range(1, len(trace.compacted_refs) + 1)]
    assert trace.tokens_after <= limit // 2 < trace.tokens_before
    # It stops once under the target: the newer old bodies stay whole.
    assert len(trace.compacted_refs) < 9
    assert result.messages[-1] == entries[-1].message  # the latest step is untouched
    assert [m.get("tool_call_id") for m in result.messages] == [e.message.get("tool_call_id") for e in entries]
    assert result.previewed_refs == tuple(trace.compacted_refs)
    assert summarizer.history == []


async def test_the_latest_step_body_is_previewed_only_when_it_alone_is_oversized() -> None:
    entries, _ = agent_run(3, chars=800)
    huge, _ = agent_run(1, chars=40_000)
    last = HistoryEntry(
        {"role": "tool", "tool_call_id": "call_3", "content": huge[-1].message["content"]}, "h-last", "to_last"
    )
    entries = [*entries[:-1], last]
    limit = cost([e.message for e in entries]) + 100  # over the threshold, mostly because of that body
    result = await compact(entries, limit=limit)
    assert "to_last" in result.trace.compacted_refs
    assert is_preview(result.messages[-1]["content"]) and result.messages[-1]["tool_call_id"] == "call_3"
    # With a higher bar for the latest body, it stays whole even though the target is missed.
    config = CompactionConfig(latest_body_percent=100)
    result = await compact(entries, limit=limit, config=config)
    assert result.messages[-1] == last.message


async def test_bodies_without_a_reference_are_kept_for_the_summarizer() -> None:
    entries, _ = agent_run(8, refs=False)
    limit = int(cost([e.message for e in entries]) / 0.9)
    summarizer = FakeSummarizer(default=good_checkpoint)
    result = await compact(entries, limit=limit, summarizer=summarizer)
    assert result.trace.compacted_refs == []
    assert len(summarizer.history) == 1
    source = summarizer.history[0][-1]["content"]
    assert quote_body(entries[2].message["content"]) in source  # the whole unreferenced body reaches the summarizer


async def test_summarizes_oldest_finished_steps_into_a_checkpoint_after_the_anchor() -> None:
    entries, _ = agent_run(12, refs=False)
    limit = int(cost([e.message for e in entries]) / 0.9)
    summarizer = FakeSummarizer(default=good_checkpoint)
    result = await compact(entries, limit=limit, summarizer=summarizer)
    assert result.new_checkpoint and result.checkpoint is not None
    messages = result.messages
    assert messages[0] == entries[0].message  # the anchor, verbatim
    assert is_checkpoint_message(messages[1], NONCE) and result.checkpoint_index == 1
    assert messages[-2:] == tuple(dict(e.message) for e in entries[-2:])  # the latest step
    assert_protocol_valid(messages)
    covered = result.checkpoint.covered_messages
    assert entries[covered].chain_hash == result.checkpoint.covers_hash  # anchor at 0, covered 1..covered
    assert list(messages[2:]) == [dict(e.message) for e in entries[covered + 1 :]]
    trace = result.trace
    assert trace.summarized_messages == covered and covered % 2 == 0  # whole units only
    assert trace.checkpoint_tokens < trace.summary_source_tokens
    assert trace.tokens_after <= limit // 2 < trace.tokens_before
    assert trace.attempts == 1 and trace.rejections == [] and trace.errors == []
    history, checkpoint = result.history_and_checkpoint
    assert checkpoint == messages[1] and len(history) == len(messages) - 1


async def test_oversized_checkpoint_is_rejected_retried_and_trimming_stands() -> None:
    entries, _ = agent_run(12, chars=6_000)
    limit = int(cost([e.message for e in entries]) / 0.9)
    padding = "\n".join(f"- observation {i}: " + "detail " * 40 for i in range(600))
    oversized = "## Completed work\n" + padding + "\n## Next step\n- go"
    summarizer = FakeSummarizer(default=oversized)
    config = CompactionConfig(max_summary_attempts=3)
    # The provider stated a small window: previews alone cannot reach the target, the summarizer is asked.
    deep = {"forced": True, "stated_limit": limit // 3, "config": config}
    result = await compact(entries, limit=limit, summarizer=summarizer, **deep)
    trace = result.trace
    assert len(summarizer.history) == 3 and trace.attempts == 3
    assert len(trace.rejections) == 3 and all("not smaller than its source" in r for r in trace.rejections)
    assert result.checkpoint is None and not result.new_checkpoint
    assert not any(is_checkpoint_message(m, NONCE) for m in result.messages)
    # The deterministic trimming stands: every old body is a preview, the structure is whole.
    assert trace.compacted_refs and trace.tokens_after < trace.tokens_before
    assert [m.get("tool_call_id") for m in result.messages] == [e.message.get("tool_call_id") for e in entries]
    previews_only = await compact(entries, limit=limit, **deep)
    assert result.messages == previews_only.messages


async def test_a_rejected_attempt_is_retried_and_the_retry_can_succeed() -> None:
    entries, _ = agent_run(12, refs=False)
    limit = int(cost([e.message for e in entries]) / 0.9)
    summarizer = FakeSummarizer("Sorry, I cannot help with that.", good_checkpoint)
    result = await compact(entries, limit=limit, summarizer=summarizer)
    assert result.trace.attempts == 2
    assert result.trace.rejections == ["invalid structure: no checkpoint section found"]
    assert result.new_checkpoint
    # The retry asked the same thing again.
    assert summarizer.history[0] == summarizer.history[1]


async def test_a_summary_request_the_provider_finds_over_its_window_is_asked_again_with_half_the_source() -> None:
    """Our count and the summarizer's provider may disagree (another tokenizer): its overflow is answered
    once, as a turn's is, by planning again with half the source; the smaller request is answered."""
    from proxy.kernel.errors import ContextOverflow

    entries, _ = agent_run(12, refs=False)
    limit = int(cost([e.message for e in entries]) / 0.9)
    overflow = ContextOverflow("maximum context length is 1024 tokens")
    summarizer = FakeSummarizer(overflow, default=good_checkpoint)
    result = await compact(entries, limit=limit, summarizer=summarizer)
    first, second = summarizer.history[:2]
    assert cost(second) < cost(first) and len(second[-1]["content"]) < len(first[-1]["content"])
    assert result.trace.errors == [f"summarizer failed: ContextOverflow: {overflow}"]  # only the first
    assert result.new_checkpoint


async def test_summarizer_failure_falls_back_to_trimming() -> None:
    entries, _ = agent_run(12, refs=False)
    limit = int(cost([e.message for e in entries]) / 0.9)
    summarizer = FakeSummarizer(default=TimeoutError("summary model timed out"))
    result = await compact(entries, limit=limit, summarizer=summarizer)
    assert result.trace.errors == ["summarizer failed: TimeoutError: summary model timed out"] * 2
    assert result.checkpoint is None
    assert list(result.messages) == [dict(e.message) for e in entries]  # nothing to preview without refs


async def test_unknown_references_in_the_checkpoint_are_reported() -> None:
    entries, _ = agent_run(12)
    limit = int(cost([e.message for e in entries]) / 0.9)
    text = "## Evidence\n- peak at ref=to_0001 and ref=to_9999\n## Next step\n- go"
    result = await compact(
        entries, limit=limit, summarizer=FakeSummarizer(default=text), forced=True, stated_limit=limit // 3
    )
    assert result.new_checkpoint
    assert result.trace.unknown_refs == ["to_9999"]
    assert "missing section 'Completed work' added empty" in result.trace.checkpoint_issues


async def test_a_stored_checkpoint_is_reused_without_summarizing_again() -> None:
    entries, _ = agent_run(12)
    limit = int(cost([e.message for e in entries]) / 0.9)
    first = await compact(
        entries, limit=limit, summarizer=FakeSummarizer(default=good_checkpoint), forced=True, stated_limit=limit // 3
    )
    assert first.checkpoint is not None
    # Two more steps later, the same prefix: the stored checkpoint and the previews come back as they were.
    more, _ = agent_run(14)
    silent = FakeSummarizer()  # raises if called
    second = await compact(
        more,
        limit=limit * 3,
        summarizer=silent,
        checkpoints=[first.checkpoint],
        previewed_refs=first.previewed_refs,
    )
    assert silent.history == []
    assert second.trace.reused_checkpoint == first.checkpoint.covers_hash
    assert second.trace.reason is None and not second.new_checkpoint
    assert second.checkpoint == first.checkpoint
    # Byte-stable prefix: everything the first pass sent is sent again unchanged (prompt cache keeps hitting).
    assert second.messages[: len(first.messages)] == first.messages
    assert len(second.messages) == len(first.messages) + 4


async def test_a_checkpoint_of_another_branch_is_not_reused() -> None:
    entries, _ = agent_run(12)
    limit = int(cost([e.message for e in entries]) / 0.9)
    first = await compact(
        entries, limit=limit, summarizer=FakeSummarizer(default=good_checkpoint), forced=True, stated_limit=limit // 3
    )
    assert first.checkpoint is not None
    other = [HistoryEntry({"role": "user", "content": "another task"}, "x0"), *entries[1:]]
    other = history_entries(
        [e.message for e in other], {i: e.tool_output_ref for i, e in enumerate(other) if e.tool_output_ref}
    )
    result = await compact(other, limit=limit * 3, checkpoints=[first.checkpoint])
    assert result.checkpoint is None and result.trace.reused_checkpoint is None


async def test_forced_pass_goes_deeper_than_a_normal_pass() -> None:
    entries, _ = agent_run(16, refs=False)
    limit = int(cost([e.message for e in entries]) / 0.9)
    normal = await compact(entries, limit=limit, summarizer=FakeSummarizer(default=good_checkpoint))
    forced = await compact(entries, limit=limit, summarizer=FakeSummarizer(default=good_checkpoint), forced=True)
    assert forced.trace.reason == "forced"
    assert forced.trace.tokens_after < normal.trace.tokens_after
    assert forced.trace.summarized_messages > normal.trace.summarized_messages
    # Forced also fires where a normal pass would not, and aims under the provider's stated limit.
    small, _ = agent_run(6)
    total = cost([e.message for e in small])
    relaxed = await compact(small, limit=total * 2)
    assert relaxed.trace.reason is None
    stated = await compact(small, limit=total * 2, forced=True, stated_limit=total, output_reserve=total // 4)
    assert stated.trace.target_tokens < total - total // 4
    assert stated.trace.tokens_after < relaxed.trace.tokens_after


async def test_kept_suffix_boundary_can_split_a_long_user_message() -> None:
    paste = "\n".join(f"pasted spectrum row {i}: {i * 3 % 101} {i * 7 % 89}" for i in range(1_500))
    tail_steps, _ = agent_run(2, chars=600)
    extra = [
        {"role": "user", "content": paste},
        *[
            {**e.message, "tool_call_id": "t" + e.message["tool_call_id"]}
            if e.message["role"] == "tool"
            else {
                **e.message,
                "tool_calls": [{**e.message["tool_calls"][0], "id": "t" + e.message["tool_calls"][0]["id"]}],
            }
            for e in tail_steps[1:]
        ],
    ]
    entries, _ = agent_run(3, chars=600, refs=False, extra=extra)
    paste_index = 7
    assert entries[paste_index].message["content"] == paste
    total = cost([e.message for e in entries])
    limit = int(total / 0.85)
    summarizer = FakeSummarizer(default=good_checkpoint)
    result = await compact(entries, limit=limit, summarizer=summarizer)
    checkpoint = result.checkpoint
    assert checkpoint is not None and checkpoint.split_chars > 0
    assert checkpoint.covers_hash == entries[paste_index].chain_hash
    cut = checkpoint.split_chars
    assert paste[cut - 1] == "\n"  # cut at a line start
    kept = result.messages[2]
    assert kept["role"] == "user" and kept["content"] == SPLIT_NOTE.format(cut=cut) + paste[cut:]
    source = summarizer.history[-1][-1]["content"]
    assert (
        quote_body(paste[:cut]) in source and quote_body(paste[cut:]) not in source
    )  # the head went to the summarizer only
    assert list(result.messages[3:]) == [dict(e.message) for e in entries[paste_index + 1 :]]
    assert result.trace.tokens_after <= limit // 2
    # Reused later, the split reproduces the same kept tail.
    again = await compact(entries, limit=limit * 3, checkpoints=[checkpoint], summarizer=FakeSummarizer())
    assert again.messages == result.messages


async def test_unfinished_calls_are_never_summarized() -> None:
    unfinished = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_open", "type": "function", "function": {"name": "measure", "arguments": "{}"}}],
    }
    entries, _ = agent_run(4, refs=False)
    later, _ = agent_run(6, refs=False)
    messages = [e.message for e in entries] + [unfinished, {"role": "user", "content": "still waiting?"}]
    messages += [e.message for e in later[1:]]
    entries = history_entries(messages)
    limit = int(cost(messages) / 0.9)
    result = await compact(entries, limit=limit, summarizer=FakeSummarizer(default=good_checkpoint), forced=True)
    assert result.checkpoint is not None
    assert unfinished in result.messages
    assert result.checkpoint.covered_messages <= 8


async def test_a_fact_in_an_early_body_stays_readable_after_its_preview() -> None:
    fact = "FACT: melting point of compound X = 1234.5 K (+/- 0.7 K)"
    entries, bodies = agent_run(10, chars=12_000, fact=fact)
    limit = int(cost([e.message for e in entries]) / 0.85)
    result = await compact(entries, limit=limit)
    first_body = result.messages[2]["content"]
    assert is_preview(first_body) and fact not in first_body
    assert "ref=to_0001" in first_body
    assert not any(fact in content_text(m.get("content")) for m in result.messages)

    class Store:
        async def get(self, ref: str) -> str | None:
            return bodies.get(ref)

    answer = await read_tool_output(Store(), {"ref": "to_0001", "query": "melting point"})
    assert fact in answer


async def test_previews_are_reproduced_byte_for_byte() -> None:
    entries, _ = agent_run(10)
    limit = int(cost([e.message for e in entries]) / 0.85)
    one = await compact(entries, limit=limit)
    two = await compact(entries, limit=limit)
    assert one.messages == two.messages and one.previewed_refs == two.previewed_refs


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[HistoryEntry], list[Reply]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": ANCHOR}]
    refs: dict[int, str] = {}
    for k in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["step", "step", "parallel", "user", "long_user"]))
        if kind == "user":
            messages.append({"role": "user", "content": f"note {k}: keep going"})
        elif kind == "long_user":
            messages.append({"role": "user", "content": body(k, draw(st.integers(500, 8_000)))})
        else:
            n = 2 if kind == "parallel" else 1
            calls = [
                {"id": f"c{k}_{j}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for j in range(n)
            ]
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            for j in range(n):
                messages.append(
                    {"role": "tool", "tool_call_id": f"c{k}_{j}", "content": body(k, draw(st.integers(10, 6_000)))}
                )
                if draw(st.booleans()):
                    refs[len(messages) - 1] = f"to_{k}_{j}"
    if draw(st.booleans()):
        messages.append({"role": "assistant", "content": "done for now"})
    replies = draw(st.lists(st.sampled_from(["good", "big", "bad", "raise"]), min_size=0, max_size=4))
    choices: dict[str, Reply] = {
        "good": good_checkpoint,
        "big": "## Next step\n" + "- x\n" * 4_000,
        "bad": "nothing",
        "raise": RuntimeError("down"),
    }
    script = [choices[reply] for reply in replies]
    return history_entries(messages, refs), script


@settings(max_examples=50, deadline=None)
@given(case=histories(), percent=st.integers(20, 120), forced=st.booleans())
async def test_compaction_invariants(case: tuple[list[HistoryEntry], list[Reply]], percent: int, forced: bool) -> None:
    entries, script = case
    messages = [dict(e.message) for e in entries]
    total = cost(messages)
    limit = max(1, total * 100 // percent)
    result = await compact(
        entries, limit=limit, summarizer=FakeSummarizer(*script, default=good_checkpoint), forced=forced
    )
    out = result.messages
    assert_protocol_valid(out)
    assert cost(out) <= total
    assert result.trace.tokens_after == cost(out) and result.trace.tokens_before == total
    assert out[0] == messages[0]  # the anchor, verbatim
    # The latest step keeps its structure (its bodies at most previewed) at the end.
    last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages) - 1)
    latest = messages[last_assistant:]
    kept = out[len(out) - len(latest) :]
    assert [(m["role"], m.get("tool_call_id"), m.get("tool_calls")) for m in kept] == [
        (m["role"], m.get("tool_call_id"), m.get("tool_calls")) for m in latest
    ]
    # What the window is handed with the history is what splitting and counting it would give.
    history, _ = result.history_and_checkpoint
    assert result.history_costs == tuple(ESTIMATOR.count_message(m) for m in history)
    if result.history_units is not None:
        assert list(result.history_units) == split_units(history)
    assert result.history_units is not None or not result.trace.reason  # made whenever trimming ran
    again = await compact(
        entries, limit=limit, summarizer=FakeSummarizer(*script, default=good_checkpoint), forced=forced
    )
    assert again.messages == out  # deterministic, given the same summarizer answers


async def test_a_long_run_stays_within_the_window_turn_after_turn() -> None:
    """60 steps of ~12 KB outputs at a 16k window, compacted every turn as the caller would drive it."""
    fact = "FACT: the calibration constant is 0.98731"
    full, bodies = agent_run(60, chars=12_000, fact=fact)
    estimator = CachingEstimator(ESTIMATOR)
    limit, fixed = 16_000 - 4_096, 1_500
    compactor = HistoryCompactor()
    checkpoints: list[Checkpoint] = []
    previewed: tuple[str, ...] = ()
    previous: tuple[dict[str, Any], ...] = ()
    fired = turns = 0
    for n in range(3, len(full) + 1, 2):
        turns += 1
        summarizer = FakeSummarizer(default=good_checkpoint)
        result = await compactor.compact(
            full[:n],
            nonce=NONCE,
            limit=limit,
            estimator=estimator,
            summarizer=summarizer,
            fixed_tokens=fixed,
            checkpoints=checkpoints,
            previewed_refs=previewed,
        )
        assert result.trace.tokens_after <= limit * 80 // 100
        assert_protocol_valid(result.messages)
        if result.new_checkpoint:
            assert result.checkpoint is not None
            checkpoints.append(result.checkpoint)
        previewed = result.previewed_refs
        if result.messages[: len(previous)] != previous:
            fired += 1
        previous = result.messages
    # A 12 KB body is ~5k tokens, 44 % of this window: even so, most turns keep the sent prefix unchanged.
    assert fired < turns // 2
    assert not any(fact in content_text(m.get("content")) for m in previous)

    class Store:
        async def get(self, ref: str) -> str | None:
            return bodies.get(ref)

    assert fact in await read_tool_output(Store(), {"ref": "to_0001", "query": "calibration constant"})


async def test_a_large_history_the_turn_counted_already_is_trimmed_on_the_event_loop() -> None:
    import threading

    from proxy.context.turn_estimator import TurnEstimator

    messages = [{"role": "user", "content": ANCHOR}]
    for k in range(300):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]}]
        messages += [{"role": "tool", "tool_call_id": f"c{k}", "content": body(k, 3_000)}]
    entries = history_entries(messages, {i: f"to_{i}" for i, m in enumerate(messages) if m["role"] == "tool"})
    threads: list[str] = []

    class Recording(ConservativeTokenEstimator):
        def count_message(self, message: Any) -> int:
            threads.append(threading.current_thread().name)
            return super().count_message(message)

    limit = cost(messages) // 2
    shared = CachingEstimator(Recording())  # the counts a process keeps between turns
    first = TurnEstimator(shared)
    first.name_history(entries)
    await HistoryCompactor().compact(entries, nonce=NONCE, limit=limit, estimator=first)
    assert threading.main_thread().name not in threads[:10]  # a history counted now: on a worker thread
    call = {"id": "c_new", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    step = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    step += [{"role": "tool", "tool_call_id": "c_new", "content": body(999, 3_000)}]
    resent = [*messages, *step]  # the next turn: the history resent with a step added
    entries = history_entries(resent, {i: f"to_{i}" for i, m in enumerate(resent) if m["role"] == "tool"})
    counted = TurnEstimator(shared)
    counted.name_history(entries)  # the step is counted here, the rest is known
    assert counted.has_counted([e.message for e in entries])
    threads.clear()
    await HistoryCompactor().compact(entries, nonce=NONCE, limit=limit, estimator=counted)
    # What the trimming counts (the previews new to the shared cache) is counted on the loop: no hop.
    assert threads and set(threads) == {threading.main_thread().name}
