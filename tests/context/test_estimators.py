"""Estimators: the conservative one never under-counts tiktoken; the cache pays only for new messages."""

import json
import math
import string
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.context import estimators
from proxy.context.cjk_costs import cost_table
from proxy.context.estimators import (
    MESSAGE_OVERHEAD_TOKENS,
    CachingEstimator,
    ConservativeTokenEstimator,
    ScaledEstimator,
    TiktokenEstimator,
)
from proxy.context.turn_estimator import TurnEstimator, count_named, counts_of
from proxy.kernel.canonical import HistoryEntry, chain_hashes, stable_json

ENCODINGS = [tiktoken.get_encoding(name) for name in ("cl100k_base", "o200k_base")]
ESTIMATOR = ConservativeTokenEstimator()
SHARED = Path("/work/shared")


def exact(text: str) -> int:
    return max(len(enc.encode(text, disallowed_special=())) for enc in ENCODINGS)


WORDS = [
    "the",
    "of",
    "and",
    "protein",
    "structure",
    "prediction",
    "spectroscopy",
    "phosphorylation",
    "we",
    "show",
    "that",
    "temperature",
    "catalyst",
    "yield",
    "enzyme",
    "kinetics",
    "Michaelis",
    "Menten",
    "genome",
    "CRISPR",
    "DFT",
    "B3LYP",
    "basis",
    "set",
    "convergence",
    "Hamiltonian",
    "eigenvalue",
    "QWEN",
    "GROQ",
    "BAAI",
    "kyma",
    "ecdh",
    "dfae",
    "HTTP",
    "JSON",
    "API",
    "Bayesian",
    "posterior",
    "p-value",
    "ANOVA",
    "mRNA",
    "DNA",
    "RNA-seq",
]


def gb2312_level1() -> list[str]:
    """The 3,755 common Chinese characters (GB2312 level 1): what research text is made of."""
    chars = []
    for hi in range(0xB0, 0xD8):
        for lo in range(0xA1, 0xFF):
            try:
                chars.append(bytes([hi, lo]).decode("gb2312"))
            except UnicodeDecodeError:
                continue
    return chars


CJK_COMMON = gb2312_level1()
PUNCT = list("，。、：；！？（）“”《》—…") + list(".,;:!?()[]{}\"'-_/\\=+*<>@#$%^&|~`")

piece = st.one_of(
    st.sampled_from(WORDS),
    st.text(st.sampled_from(CJK_COMMON), min_size=1, max_size=40),
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(st.sampled_from("0123456789abcdef"), min_size=1, max_size=40),  # hashes, ids
    st.text(st.sampled_from(PUNCT), min_size=1, max_size=6),
    st.sampled_from([" ", "\n", "\n\n", "    ", "\t", "\n        "]),
    st.text(st.characters(codec="utf-8"), max_size=8),  # anything at all, in small doses
)
mixed_text = st.lists(piece, max_size=60).map(" ".join)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | mixed_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(WORDS), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=50, deadline=None)
@given(mixed_text)
@example("一 倍 倍 倍")  # a space before a CJK character: cl100k splits it into three tokens
def test_never_under_on_mixed_research_text(text: str) -> None:
    assert ESTIMATOR.count_text(text) >= exact(text)


@settings(max_examples=50, deadline=None)
@given(json_value, st.booleans())
def test_never_under_on_json(value: object, pretty: bool) -> None:
    text = json.dumps(value, ensure_ascii=False, indent=2 if pretty else None)
    assert ESTIMATOR.count_text(text) >= exact(text)


@settings(max_examples=50, deadline=None)
@given(st.text(st.sampled_from(sorted(cost_table())), min_size=1, max_size=80))
def test_never_under_on_any_cjk_run(text: str) -> None:
    assert ESTIMATOR.count_text(text) >= exact(text)


def corpus_chunks() -> list[tuple[str, str]]:
    site = Path(json.__file__).parent  # the stdlib: real code and English docstrings
    texts = {
        "spec-en": (SHARED / "seed" / "SPEC.md").read_text(),
        "spec-zh": (SHARED / "seed" / "dynamic-context-assembly.zh.txt").read_text(),
        "design": (SHARED / "DESIGN.md").read_text(),
        "code": (site / "decoder.py").read_text() + (site / "encoder.py").read_text(),
    }
    chunks = []
    for name, text in texts.items():
        for size in (7, 50, 400, 3000):
            chunks += [(name, text[i : i + size]) for i in range(0, len(text), max(size, 97))]
    return chunks


def test_never_under_on_the_corpus() -> None:
    chunks = corpus_chunks()
    assert len(chunks) > 200
    under = [(name, text) for name, text in chunks if ESTIMATOR.count_text(text) < exact(text)]
    assert under == []


def test_over_count_stays_modest_on_real_text() -> None:
    # "as little as that allows": whole documents land within 2.2x of the larger tokenizer count.
    for path in (SHARED / "seed" / "SPEC.md", SHARED / "seed" / "dynamic-context-assembly.zh.txt"):
        text = path.read_text()
        assert ESTIMATOR.count_text(text) <= 2.2 * exact(text)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_tool_output",
            "description": "读取已存储的工具输出。Read a stored tool output by reference, query or line range.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "ref": {"type": "string", "pattern": "[A-Za-z0-9_.:-]+"},
                    "query": {"type": ["string", "null"]},
                    "start_line": {"type": ["integer", "null"], "minimum": 1},
                },
                "required": ["ref", "query", "start_line"],
                "additionalProperties": False,
            },
        },
    }
]


def test_tool_schemas_not_under() -> None:
    assert ESTIMATOR.count_tools(TOOLS) >= exact(stable_json(TOOLS[0]))


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_tiktoken_estimator_is_exact(name: str) -> None:
    est = TiktokenEstimator(name)
    text = "温度升高使反应速率加快 by 2.5x <|endoftext|>"
    assert est.count_text(text) == len(tiktoken.get_encoding(name).encode(text, disallowed_special=()))
    assert est.count_message({"role": "user", "content": text}) == est.count_text(text) + MESSAGE_OVERHEAD_TOKENS


def test_message_counts_tool_calls_and_ids() -> None:
    bare = {"role": "assistant", "content": None}
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
    }
    assert ESTIMATOR.count_message(call) > ESTIMATOR.count_message(bare) >= MESSAGE_OVERHEAD_TOKENS
    result = {"role": "tool", "tool_call_id": "call_1", "content": "ok"}
    assert ESTIMATOR.count_message(result) > ESTIMATOR.count_message({"role": "tool", "content": "ok"})


def test_empty_text_is_free() -> None:
    assert ESTIMATOR.count_text("") == 0


class CountingEstimator(ConservativeTokenEstimator):
    def __init__(self) -> None:
        super().__init__()
        self.history: list[object] = []

    def count_message(self, message: dict) -> int:  # type: ignore[override]
        self.history.append(message)
        return super().count_message(message)


def test_cache_pays_only_for_new_messages() -> None:
    inner = CountingEstimator()
    cache = CachingEstimator(inner)
    turn = [{"role": "user", "content": f"message {i}"} for i in range(50)]
    first = [cache.count_message(m) for m in turn]
    assert len(inner.history) == 50
    turn.append({"role": "assistant", "content": "new"})
    second = [cache.count_message(m) for m in turn]
    assert second[:50] == first
    assert len(inner.history) == 51 and cache.hits == 50 and cache.misses == 51


def test_a_resent_history_is_counted_by_chain_hash_and_only_new_messages_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = CountingEstimator()
    cache = CachingEstimator(inner)
    turn = [{"role": "user", "content": f"message {i}"} for i in range(50)]
    first = [cache.count_message_at(h, m) for h, m in zip(chain_hashes(turn), turn, strict=True)]
    assert first == [ESTIMATOR.count_message(m) for m in turn] and len(inner.history) == 50

    resent = [*(dict(m) for m in turn), {"role": "assistant", "content": "new"}]
    hashes = chain_hashes(resent)
    digests = record_digests(monkeypatch)
    second = [cache.count_message_at(h, m) for h, m in zip(hashes, resent, strict=True)]
    assert second[:50] == first and len(inner.history) == 51
    assert digests == [resent[-1]]  # the unchanged prefix was looked up by name, never hashed again
    # A forked history's known messages (new chain hashes, same content) are not counted again either.
    fork = [{"role": "system", "content": "other"}, *turn]
    assert [cache.count_message_at(h, m) for h, m in zip(chain_hashes(fork), fork, strict=True)][1:] == first
    assert len(inner.history) == 52
    # Anything but a chain hash is counted by content only.
    assert cache.count_message_at("not a chain hash", turn[0]) == first[0] and len(inner.history) == 52
    # Looked up in one pass by name, without counting: what is known, and None for the rest and non-names.
    hits = cache.hits
    new_name, not_hex = "0" * 63 + "1", "z" * 64
    assert cache.known_counts_at([*hashes, new_name, not_hex, "short"]) == [*second, None, None, None]
    assert cache.hits == hits + 51 and len(inner.history) == 52


def test_calibration_scales_the_cached_base_count_never_a_scaled_one() -> None:
    base = CachingEstimator(CountingEstimator())
    message = {"role": "user", "content": "scale me " * 40}
    (name,) = chain_hashes([message])
    plain = base.count_message_at(name, message)
    assert ScaledEstimator(base, 1.5).count_message_at(name, message) == math.ceil(plain * 1.5)
    assert ScaledEstimator(base, 1.1).count_message_at(name, message) == math.ceil(plain * 1.1)
    assert base.count_message_at(name, message) == plain


def test_a_turn_estimator_counts_named_history_and_its_copies_by_chain_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = CachingEstimator(CountingEstimator())
    history = [{"role": "user", "content": f"step {i}"} for i in range(100)]
    entries = [HistoryEntry(m, h) for m, h in zip(history, chain_hashes(history), strict=True)]
    TurnEstimator(inner).name_history(entries)  # a history of unknown messages is not counted when named
    assert inner.misses == 0
    first = TurnEstimator(inner)
    first.name_history(entries)
    counts = [first.count_message(dict(m)) for m in history]  # shallow copies, as the stages make them
    second = TurnEstimator(inner)
    second.name_history(entries)
    digests = record_digests(monkeypatch)
    assert [second.count_message(m) for m in history] == counts
    assert digests == [] and inner.hits == 100


def test_naming_a_resent_history_counts_what_it_adds_and_the_whole_sequence_is_then_known() -> None:
    counting = CountingEstimator()
    inner = CachingEstimator(counting)
    history = [{"role": "user", "content": f"step {i}"} for i in range(100)]
    first = TurnEstimator(inner)
    first.name_messages(history, chain_hashes(history))
    assert first.counts(history) == [ESTIMATOR.count_message(m) for m in history] and len(counting.history) == 100
    resent = [*(dict(m) for m in history), {"role": "assistant", "content": "new"}, {"role": "user", "content": "go"}]
    turn = TurnEstimator(inner)
    turn.name_messages(resent, chain_hashes(resent))
    assert len(counting.history) == 102  # the two new ones, counted when named
    hits = inner.hits
    assert turn.counts(resent) == [ESTIMATOR.count_message(m) for m in resent]
    assert turn.counts(list(resent))[-1] == ESTIMATOR.count_message(resent[-1])  # the same messages, another list
    assert inner.hits == hits and len(counting.history) == 102  # the turn's memo, not the cache


def test_a_named_message_known_to_the_cache_is_memoized_when_named_and_recounted_once_rewritten() -> None:
    counting = CountingEstimator()
    inner = CachingEstimator(counting)
    history = [{"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i} " * 20} for i in range(5)]
    hashes = chain_hashes(history)
    known = [inner.count_message_at(h, m) for h, m in zip(hashes, history, strict=True)]
    turn = TurnEstimator(inner)
    turn.name_messages(history, hashes)  # the cached prefix is looked up here, once
    hits = inner.hits
    assert [turn.count_message(m) for m in history] == known and inner.hits == hits  # memo hits only
    history[2]["content"] = "rewritten in place " * 50  # a stage that changed it after naming (none does)
    assert turn.count_message(history[2]) == known[2]  # still named by its chain hash, as before naming
    assert turn.count_message(dict(history[3])) == known[3] and len(counting.history) == 5


def test_named_known_messages_are_found_alone_without_indexing_and_a_long_recount_indexes_them() -> None:
    counting = CountingEstimator()
    inner = CachingEstimator(counting)
    history = [{"role": "user" if i % 3 else "tool", "content": f"entry {i} " * (i % 7 + 1)} for i in range(40)]
    history.append({"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]})
    hashes = chain_hashes(history)
    known = [inner.count_message_at(h, m) for h, m in zip(hashes, history, strict=True)]
    asked = len(counting.history)
    turn = TurnEstimator(inner)
    turn.name_messages(history, hashes)
    assert turn._unindexed  # a warm turn's naming builds no per-message maps
    # A few messages counted alone (a shallow copy, the very object, one of equal text that is no copy)
    assert turn.count_message(dict(history[5])) == known[5] and turn.count_message(history[9]) == known[9]
    equal = {"role": "user", "content": "entry 8 " * 2}  # equal to history[8]'s text, another string object
    assert turn.count_message(equal) == ESTIMATOR.count_message(equal) and turn._unindexed
    assert len(counting.history) == asked  # the copies from the batch, the equal text from the shared cache
    copies = [dict(m) for m in history]  # a stage's copies, counted message by message: indexed once
    assert turn.counts(copies) == known and not turn._unindexed
    assert len(counting.history) == asked
    assert turn.count_message(dict(history[-1])) == known[-1]  # a copy found by its tool calls


def test_a_turn_estimator_scales_its_memo_of_base_counts_and_reads_them_unscaled() -> None:
    inner = CountingEstimator()
    turn = TurnEstimator(inner, 1.3)
    messages = [{"role": "user", "content": f"measure sample {i} " * 9} for i in range(12)]
    scaled = [turn.count_message(m) for m in messages]
    base = [turn.unscaled().count_message(m) for m in messages]  # the calibration sample of the same turn
    assert scaled == [math.ceil(b * 1.3) for b in base] and base == [inner.count_message(m) for m in messages]
    assert len(inner.history) == 12 + 12  # each message counted once by the memo (then once above, directly)
    assert turn.count_text("two words") == math.ceil(inner.count_text("two words") * 1.3)


def test_a_turn_estimator_counts_a_message_again_when_its_content_was_replaced() -> None:
    inner = CountingEstimator()
    turn = TurnEstimator(inner)
    message = {"role": "tool", "tool_call_id": "c1", "content": "short"}
    first = turn.count_message(message)
    message["content"] = "a much longer tool output " * 30  # a stage that rewrote it in place (none does)
    assert turn.count_message(message) > first and len(inner.history) == 2


def test_one_turn_counter_serves_the_assembly_the_trace_and_the_calibration_sample() -> None:
    inner = CachingEstimator(CountingEstimator())
    history = [{"role": "user", "content": f"step {i}"} for i in range(30)]
    turn = TurnEstimator(inner, 1.1)
    turn.name_messages(history, chain_hashes(history))
    window = [turn.count_message(m) for m in history]  # the stages count the client's own messages
    sent = [dict(m) for m in history]  # what the provider is handed: copies
    assert [turn.count_message(m) for m in sent] == window
    assert sum(turn.unscaled().count_message(m) for m in sent) == sum(inner.count_message(m) for m in history)
    assert inner.inner.history == history  # type: ignore[attr-defined]  # each message counted once, ever


@given(
    st.lists(st.text(max_size=40), min_size=1, max_size=12),
    st.sampled_from([1.0, 1.1, 1.37]),
    st.lists(st.integers(min_value=0, max_value=11), max_size=4),
)
def test_counting_a_sequence_at_once_equals_counting_each_message(
    texts: list[str], factor: float, rewritten: list[int]
) -> None:
    history = [{"role": "user" if i % 2 else "assistant", "content": text} for i, text in enumerate(texts)]
    turn = TurnEstimator(CachingEstimator(ConservativeTokenEstimator()), factor)
    turn.name_messages(history, chain_hashes(history))
    copies = [dict(m) for m in history]  # the composer's shallow copies, counted by the validator
    expected = [
        math.ceil(ESTIMATOR.count_message(m) * factor) if factor != 1.0 else ESTIMATOR.count_message(m) for m in history
    ]
    assert turn.counts(copies) == expected == [turn.count_message(m) for m in copies]
    assert counts_of(turn.unscaled(), copies) == [ESTIMATOR.count_message(m) for m in history]
    for index in rewritten:  # a stage that rewrote a message in place after it was counted (none does)
        if index < len(copies):
            copies[index]["content"] = "rewritten in place, much longer than before " * 3
    assert turn.counts(copies) == [turn.count_message(m) for m in copies]
    assert counts_of(ESTIMATOR, copies) == [ESTIMATOR.count_message(m) for m in copies]


def test_the_same_sequence_counted_again_is_recognized_whole() -> None:
    inner = CountingEstimator()
    turn = TurnEstimator(inner)
    sent = [{"role": "user", "content": f"sample {i}"} for i in range(40)]
    first = turn.counts(sent)
    calls: list[object] = []
    turn.base_count_message = lambda message: calls.append(message) or 0  # type: ignore[method-assign]
    assert turn.unscaled().counts(list(sent)) == first  # the calibration sample: the very messages again
    assert calls == [] and len(inner.history) == 40
    turn.counts(sent).append(0)  # a caller's list is its own: the memo is not changed through it
    assert turn.counts(sent) == first


def test_a_sequence_holding_a_counted_one_takes_its_counts_whole_and_counts_only_the_rest() -> None:
    inner = CountingEstimator()
    turn = TurnEstimator(inner, 1.1)
    history = [{"role": "user" if i % 2 else "assistant", "content": f"step {i}"} for i in range(30)]
    counted = turn.counts(history)
    system, note = {"role": "system", "content": "the prompt"}, {"role": "user", "content": "a hidden note"}
    calls: list[object] = []
    real = turn.base_count_message
    turn.base_count_message = lambda message: calls.append(message) or real(message)  # type: ignore[method-assign]
    composed = [system, *history, note]  # the validator's input: the prompt, the history, a contributor's message
    assert turn.counts(composed) == [turn.count_message(system), *counted, turn.count_message(note)]
    assert calls[:2] == [system, note]  # the history was taken whole, not looked up message by message
    history[3]["content"] = "rewritten in place since, and longer than before"  # no stage does: counted again
    recounted = turn.counts([system, *history])
    fresh = TurnEstimator(CountingEstimator(), 1.1).count_message(history[3])
    assert recounted[4] == fresh != counted[3] and recounted[5:] == counted[4:]


def test_naming_the_same_history_again_is_a_no_op_and_a_changed_one_is_named() -> None:
    inner = CachingEstimator(CountingEstimator())
    history = [{"role": "user", "content": f"step {i}"} for i in range(10)]
    hashes = chain_hashes(history)
    known = [inner.count_message_at(h, m) for h, m in zip(hashes, history, strict=True)]
    turn = TurnEstimator(inner)
    turn.name_messages(history, hashes)
    hits = inner.hits
    turn.name_history([HistoryEntry(m, h) for m, h in zip(history, hashes, strict=True)])  # the assembly's naming
    assert inner.hits == hits  # recognized as already named: the cache was not asked again
    longer = [*history, {"role": "assistant", "content": "a proxy step"}]
    turn.name_messages(longer, chain_hashes(longer))
    assert inner.hits == hits + 10 and [turn.count_message(m) for m in history] == known


def record_digests(monkeypatch: pytest.MonkeyPatch, name: str = "message_digest") -> list[Any]:
    """From now on, what the cache digests with ``estimators.<name>`` (the messages whose content digest
    it computes, by default)."""
    calls: list[Any] = []
    real = getattr(estimators, name)

    def recording(value: Any) -> bytes:
        calls.append(value)
        return real(value)

    monkeypatch.setattr(estimators, name, recording)
    return calls


def test_cache_keys_ignore_cosmetic_differences_and_stay_bounded() -> None:
    inner = CountingEstimator()
    cache = CachingEstimator(inner, max_bytes=2 * CachingEstimator.ENTRY_BYTES)
    cache.count_message({"role": "user", "content": "a"})
    cache.count_message({"role": "user", "content": "a", "refusal": None})
    assert len(inner.history) == 1
    for text in "bcd":
        cache.count_message({"role": "user", "content": text})
    assert len(cache._cache) == 2


def test_cache_memory_stays_within_its_byte_bound_under_many_large_distinct_entries() -> None:
    # 2,000 distinct 100 KB tool results, texts and tool lists: keyed by their text, the cache would keep
    # about 600 MB alive; keyed by digests it keeps at most its max_bytes.
    cache = CachingEstimator(FixedEstimator(), max_bytes=500 * CachingEstimator.ENTRY_BYTES)
    bound = cache.max_bytes
    body = "x" * 100_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2_000):
            big = f"{i}:{body}"
            cache.count_message({"role": "tool", "tool_call_id": f"call_{i}", "content": big})
            cache.count_message({"role": "user", "content": [{"type": "text", "text": big}]})
            cache.count_text(big)
            cache.count_tools([{"type": "function", "function": {"name": f"t{i}", "description": big}}])
            del big
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache._cache) == cache.max_entries
    assert retained < bound, f"{retained} bytes retained, bound {bound}"
    assert cache.misses == 8_000


def test_chain_hash_entries_stay_within_the_byte_bound() -> None:
    # History messages are cached under their chain hash strings; with the chain memo gone, the cache
    # alone holds each 64-character key.
    cache = CachingEstimator(FixedEstimator(), max_bytes=500 * CachingEstimator.ENTRY_BYTES)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2_000):
            name = format(i, "064x")
            cache.count_message_at(name, {"role": "user", "content": "x"})
            del name
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache._cache) == cache.max_entries
    assert retained < cache.max_bytes, f"{retained} bytes retained, bound {cache.max_bytes}"


class FixedEstimator:
    """Counts without looking at the text, so the test measures the cache, not the estimator."""

    def count_text(self, text: str) -> int:
        return 1_000 + len(text) % 97

    def count_message(self, message: dict) -> int:  # type: ignore[type-arg]
        return 2_000 + len(str(message.get("content"))) % 89

    def count_tools(self, tools: list) -> int:  # type: ignore[type-arg]
        return 3_000 + len(tools)


def test_images_cost_a_bounded_amount_other_parts_their_json() -> None:
    from proxy.context.estimators import IMAGE_PART_TOKENS

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    text = {"type": "text", "text": "describe"}
    with_image = ESTIMATOR.count_message({"role": "user", "content": [text, image]})
    assert with_image == ESTIMATOR.count_message({"role": "user", "content": [text]}) + IMAGE_PART_TOKENS
    audio = {"type": "input_audio", "input_audio": {"data": "xyz " * 50, "format": "wav"}}
    assert ESTIMATOR.count_message({"role": "user", "content": [audio]}) > 50


@pytest.mark.parametrize("text", ["\x00" * 50, "\x07\x1b[0m" * 20, "\x7f" * 30, "\u3000\xa0" * 20])
def test_control_and_odd_whitespace_characters_are_counted(text: str) -> None:
    assert ESTIMATOR.count_text(text) >= exact(text)


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.text(max_size=200), st.text(st.sampled_from(string.printable), max_size=300)))
def test_never_under_even_on_arbitrary_text(text: str) -> None:
    # Beyond the promise (research text, JSON, code): random Unicode and printable-ASCII soup.
    assert ESTIMATOR.count_text(text) >= exact(text)


def test_a_named_message_is_counted_once_by_name_across_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    # A preview the compactor re-applies every turn is a new dict each time, named by PreviewMemo.
    inner = CountingEstimator()
    cache = CachingEstimator(inner)
    preview = {"role": "tool", "tool_call_id": "c1", "content": "[tool output compacted: ...] head ... tail"}
    name = "ab" * 32
    first = TurnEstimator(cache).count_message_named(dict(preview), name)
    assert first == ESTIMATOR.count_message(preview) and len(inner.history) == 1
    digests = record_digests(monkeypatch)
    turn = TurnEstimator(cache, 1.5)
    again = dict(preview)
    assert turn.count_message_named(again, name) == math.ceil(first * 1.5)
    assert turn.count_message(again) == math.ceil(first * 1.5)  # the same object: the turn's memo
    assert digests == [] and len(inner.history) == 1  # found by name, not digested
    # Through counts_of's helper, any estimator: by name where it can, by content otherwise.
    assert count_named(cache, dict(preview), name) == first
    assert count_named(ESTIMATOR, dict(preview), name) == first


def test_a_turn_counts_its_tools_once_for_the_list_and_its_shallow_copies() -> None:
    class ToolCounting(ConservativeTokenEstimator):
        calls = 0

        def count_tools(self, tools: Any) -> int:
            ToolCounting.calls += 1
            return super().count_tools(tools)

    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": {"type": "object"}}} for i in range(3)
    ]
    turn = TurnEstimator(ToolCounting(), 1.5)
    first = turn.count_tools(tools)
    assert first == math.ceil(ESTIMATOR.count_tools(tools) * 1.5)
    assert turn.count_tools([dict(t) for t in tools]) == first and turn.unscaled().count_tools(
        tools
    ) == ESTIMATOR.count_tools(tools)
    assert ToolCounting.calls == 1
    # Another list of tools, or a tool changed (a new function object), is counted.
    assert turn.count_tools(tools[:2]) == math.ceil(ESTIMATOR.count_tools(tools[:2]) * 1.5)
    changed = [*tools[:2], {**tools[2], "function": {"name": "other", "parameters": {"type": "object"}}}]
    assert turn.count_tools(changed) == math.ceil(ESTIMATOR.count_tools(changed) * 1.5)
    renamed = [*tools[:2], {**tools[2], "type": "custom"}]  # the same function object, another field
    turn.count_tools(renamed)
    assert ToolCounting.calls == 4


def agent_tools(count: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": f"tool_{i}", "description": "d" * 50, "parameters": {"type": "object"}},
        }
        for i in range(count)
    ]


def test_the_clients_tools_are_digested_once_a_turn_also_when_the_assembly_adds_the_proxys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The trace's client tokens count the client's list; the assembly counts copies of it with the proxy's
    # schema after them. Both are counted right, and the client's 24 schemas are digested once.
    cache = CachingEstimator(ConservativeTokenEstimator())
    reader = {"type": "function", "function": {"name": "read_tool_output", "parameters": {"type": "object"}}}
    digested = record_digests(monkeypatch, "_tools_digest")
    for turn_number in range(2):
        client = agent_tools(24)  # decoded anew every turn
        assembly = [*(dict(tool) for tool in client), reader]
        turn = TurnEstimator(cache, 1.2)
        turn.name_tools(client)
        assert turn.count_tools(assembly) == math.ceil(ESTIMATOR.count_tools(assembly) * 1.2)
        assert turn.count_tools(client) == math.ceil(ESTIMATOR.count_tools(client) * 1.2)
        assert list(map(len, digested)) == [24, 1] * (turn_number + 1)
    assert cache.misses == 2 and cache.hits == 2  # the second turn found both lists under the same keys
    # A list that does not start with the client's tools (one withheld) is digested whole, and right.
    client = agent_tools(24)
    turn = TurnEstimator(cache)
    turn.name_tools(client)
    offered = [*(dict(tool) for tool in client[1:]), reader]
    assert turn.count_tools(offered) == ESTIMATOR.count_tools(offered)
    assert len(digested[-1]) == 24
    # A changed schema in the client's list is a new list, not the one its key named last turn.
    changed = agent_tools(24)
    changed[5]["function"]["description"] = "changed"
    turn = TurnEstimator(cache)
    turn.name_tools(changed)
    assembly = [*(dict(tool) for tool in changed), reader]
    assert (
        turn.count_tools(assembly)
        == ESTIMATOR.count_tools(assembly)
        != ESTIMATOR.count_tools([*agent_tools(24), reader])
    )


def test_the_cache_knows_tools_by_their_content_whatever_their_key_order_or_odd_text() -> None:
    cache = CachingEstimator(FixedEstimator())  # type: ignore[arg-type]
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    reordered = [{"function": {"parameters": {"type": "object"}, "name": "search"}, "type": "function"}]
    assert cache.count_tools(tools) == cache.count_tools(reordered) == 3_001
    assert cache.hits == 1 and cache.misses == 1
    other = [{"type": "function", "function": {"name": "fetch", "parameters": {"type": "object"}}}]
    cache.count_tools(other)
    assert cache.misses == 2, "different tools shared a cache entry"
    # orjson refuses a lone surrogate: such tools are still counted, and cached, by their stable JSON.
    odd = [{"type": "function", "function": {"name": "bad\ud800"}}]
    assert cache.count_tools(odd) == cache.count_tools([{"function": {"name": "bad\ud800"}, "type": "function"}])
    assert cache.misses == 3 and cache.hits == 2


def _long_text(size: int, seed: int) -> str:
    import random

    pieces = ["alpha", "beta\n\n", "  gamma", " \t", "δέλτα", "數據", "x=1;", "\n", '{"k": [1, 2]}', "   ", "end."]
    chooser = random.Random(seed)
    text = ""
    while len(text) < size:
        text += "".join(chooser.choice(pieces) for _ in range(10_000))
    return text


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_a_very_long_text_counted_in_pieces_counts_as_the_whole(name: str) -> None:
    encoding = tiktoken.get_encoding(name)
    estimator = TiktokenEstimator(name)
    for text in (_long_text(650_000, seed=1), "word " * 200_000, "a" * 450_000):
        assert "".join(estimators._pieces(text)) == text
        assert len(list(estimators._pieces(text))) > 1
        whole = len(encoding.encode(text, disallowed_special=()))
        assert abs(estimator.count_text(text) - whole) <= whole // 100_000 + 1


def test_counting_a_31_mb_text_lets_other_threads_run() -> None:
    """tiktoken builds a whole text's token list holding the GIL (1.5 s at 31 MB): a worker counting a
    huge message stalled the event loop as if it counted there. In pieces, the loop waits milliseconds."""
    import threading
    import time

    estimator = TiktokenEstimator()
    text = "x " * 15_500_000
    done = threading.Event()
    counted: list[int] = []
    worker = threading.Thread(target=lambda: (counted.append(estimator.count_text(text)), done.set()))
    gaps: list[float] = []
    last = time.monotonic()
    worker.start()
    while not done.is_set():
        time.sleep(0.005)
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    worker.join()
    assert counted == [15_500_001]
    assert len(gaps) > 100 and max(gaps) < 0.5, max(gaps)
