"""The plumbing levers' measures run and report what the report prints (small sizes: a smoke test)."""

from __future__ import annotations

from bench.levers import chat_body, gc_freeze_lever, orjson_lever
from bench.levers_part import validate
from bench.levers_turn import sequence_counts_lever
from proxy.context import turn_estimator, validator


def test_the_orjson_lever_times_both_codecs_on_the_same_body():
    figures = orjson_lever(messages=20, repeats=1)
    validate(figures)  # the report's lever interface
    assert figures["body_bytes"] > 20 * 2_000  # the body it names is the one built, ~2.5 kB a message
    assert len(chat_body(20)["messages"]) == 20
    for key in ("stdlib_parse_ms", "orjson_parse_ms", "stdlib_encode_ms", "orjson_encode_ms"):
        assert figures[key] > 0
    saved = figures["stdlib_parse_ms"] + figures["stdlib_encode_ms"] - figures["orjson_parse_ms"]
    assert figures["saved_ms"] == round(saved - figures["orjson_encode_ms"], 3)


def test_the_gc_freeze_lever_freezes_litellm_s_objects_in_a_fresh_process():
    figures = gc_freeze_lever(live_objects=100, repeats=2)
    validate(figures)
    assert figures["frozen_objects"] > 100_000
    assert figures["collect_unfrozen_ms"] > figures["collect_frozen_ms"]


def test_the_sequence_counts_lever_times_both_ways_of_counting_and_restores_them():
    figures = sequence_counts_lever(messages=20, repeats=1)
    validate(figures)
    assert figures["before_ms"] > 0 and figures["after_ms"] > 0
    assert validator.counts_of is turn_estimator.counts_of  # the stages count by sequences again


def test_the_compaction_memo_lever_times_both_ways_and_restores_the_memos():
    from bench.levers_turn import compaction_memo_lever
    from proxy.context import window
    from proxy.context.previews import PreviewMemo
    from proxy.context.units import SplitMemo

    saved = (PreviewMemo.named_preview, SplitMemo.split, window.AtomicHistoryWindowPolicy.apply)
    figures = compaction_memo_lever(messages=40, repeats=1)
    validate(figures)
    assert figures["before_ms"] > 0 and figures["after_ms"] > 0
    assert (PreviewMemo.named_preview, SplitMemo.split, window.AtomicHistoryWindowPolicy.apply) == saved


def test_the_young_threshold_lever_times_both_thresholds_and_restores_the_collector():
    import gc

    from bench.levers_turn import young_threshold_lever

    before = gc.get_threshold()
    figures = young_threshold_lever(messages=40, repeats=1)
    validate(figures)
    assert figures["before_ms"] > 0 and figures["after_ms"] > 0
    assert gc.get_threshold() == before
    gc.unfreeze()  # the lever froze what the test process had made, as the app does


def test_the_inline_contributors_lever_times_both_ways_and_restores_inline_runs():
    from bench.levers_turn import inline_contributors_lever
    from contributors.base import BuiltinContributor

    figures = inline_contributors_lever(messages=40, repeats=1)
    validate(figures)
    assert figures["before_ms"] > 0 and figures["after_ms"] > 0
    assert BuiltinContributor.runs_inline is True


def test_the_request_splice_lever_times_the_transformation_both_ways():
    from bench.fast_path import request_splice_lever

    figures = request_splice_lever(messages=40, repeats=2)
    validate(figures)
    assert figures["before_ms"] > 0 and figures["after_ms"] > 0


def test_the_message_steps_lever_times_litellm_s_steps_and_the_one_pass():
    from bench.fast_path import message_steps_lever

    figures = message_steps_lever(messages=40, repeats=2)
    validate(figures)
    assert figures["before_ms"] > 0 and figures["after_ms"] > 0


def test_the_validation_reuse_lever_times_the_edge_with_and_without_the_resent_memo():
    from bench.levers import validation_reuse_lever

    figures = validation_reuse_lever(messages=40, repeats=2)
    validate(figures)
    assert figures["before_ms"] > 0 and figures["after_ms"] > 0


def test_the_heap_kept_lever_faults_the_trimmed_pages_in_again_and_not_the_kept_ones():
    from bench.levers_heap import heap_kept_lever

    figures = heap_kept_lever(messages=400, repeats=3)
    validate(figures)
    assert figures["before_ms"] > 0 and figures["after_ms"] > 0
    # A 1 MB body's read touches hundreds of pages: after a trim they fault in again, kept they do not.
    assert figures["page_faults_before"] > 100 > figures["page_faults_after"]
