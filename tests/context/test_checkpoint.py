"""The checkpoint: fixed sections, structural normalization, unknown refs, the summary request."""

from typing import Any

from proxy.context.checkpoint import (
    SECTIONS,
    Checkpoint,
    build_summary_request,
    is_checkpoint_message,
    render_sections,
    validate_checkpoint,
)

GOOD = """\
## Completed work
- Fitted the baseline model (ref=to_aaa).
## Evidence
- RMSE 0.42 on the held-out split, see ref=to_bbb.
## Decisions
- Keep log-transform.
## Failed or abandoned directions
- Polynomial features: overfit.
## Explicit pending conditions
- User asked for a calibration plot.
## Optional directions
- Try gradient boosting.
## Next step
- Produce the calibration plot.
"""

HEADINGS = [f"## {title}" for _, title in SECTIONS]


def _headings(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.startswith("## ")]


def test_good_checkpoint_passes_unchanged_in_structure() -> None:
    report = validate_checkpoint(GOOD, known_refs={"to_aaa", "to_bbb"})
    assert report.valid and report.issues == () and report.unknown_refs == ()
    assert _headings(report.text) == HEADINGS
    assert report.sections["evidence"] == "- RMSE 0.42 on the held-out split, see ref=to_bbb."


def test_unknown_refs_are_reported_not_removed() -> None:
    report = validate_checkpoint(GOOD, known_refs={"to_aaa"})
    assert report.valid
    assert report.unknown_refs == ("to_bbb",)
    assert "ref=to_bbb" in report.text


def test_missing_sections_are_added_empty_and_reported() -> None:
    report = validate_checkpoint("## Evidence\n- x = 3\n\n## Next step\nRe-run with seed 2.")
    assert report.valid
    assert _headings(report.text) == HEADINGS
    assert report.sections["completed_work"] == ""
    assert "## Decisions\n- (none)" in report.text
    assert "missing section 'Completed work' added empty" in report.issues


def test_duplicate_sections_are_merged_in_order() -> None:
    text = "## Evidence\n- a\n## Next step\n- go\n## Evidence\n- b"
    report = validate_checkpoint(text)
    assert report.sections["evidence"] == "- a\n\n- b"
    assert "section 'Evidence' appeared 2 times; merged" in report.issues
    assert _headings(report.text).count("## Evidence") == 1


def test_exactly_one_next_step_is_kept_and_the_rest_moved_to_optional() -> None:
    text = "## Optional directions\n- maybe X\n## Next steps\n1. Do A\n   with care\n2. Do B\n3. Do C"
    report = validate_checkpoint(text)
    assert report.sections["next_step"] == "1. Do A\n   with care"
    assert report.sections["optional_directions"] == "- maybe X\n2. Do B\n3. Do C"
    assert any("more than one next step" in issue for issue in report.issues)


def test_heading_variants_fences_and_wrappers_are_recognized() -> None:
    text = (
        '```markdown\n<checkpoint covers="3 messages">\n'
        "**Completed work:**\n- done\n### 7. NEXT STEP\n- go\n</checkpoint>\n```"
    )
    report = validate_checkpoint(text)
    assert report.valid
    assert report.sections["completed_work"] == "- done"
    assert report.sections["next_step"] == "- go"


def test_preamble_and_unknown_headings_are_kept_as_text() -> None:
    text = "Here is the checkpoint.\n## Evidence\n## Raw numbers\n42\n## Next step\n- go"
    report = validate_checkpoint(text)
    assert report.sections["completed_work"] == "Here is the checkpoint."
    assert report.sections["evidence"] == "## Raw numbers\n42"
    assert any("unknown heading '## Raw numbers'" in issue for issue in report.issues)


def test_no_section_or_no_next_step_is_invalid() -> None:
    assert not validate_checkpoint("I could not summarize this.").valid
    assert not validate_checkpoint("").valid
    report = validate_checkpoint("## Evidence\n- a\n## Next step\n- (none)")
    assert not report.valid and "no next step" in report.issues


def test_normalization_is_idempotent() -> None:
    once = validate_checkpoint("## Next step\n- a\n- b\n## Evidence\nx")
    twice = validate_checkpoint(once.text)
    assert twice.text == once.text and twice.issues == ()


def test_checkpoint_message_and_record_round_trip() -> None:
    checkpoint = Checkpoint(render_sections({"next_step": "- go"}), "abc123", 17, split_chars=40)
    message = checkpoint.message()
    assert message["role"] == "user"
    assert message["content"].startswith('<checkpoint covers="17 messages">\n## Completed work')
    assert message["content"].endswith("\n</checkpoint>")
    assert is_checkpoint_message(message)
    assert not is_checkpoint_message({"role": "system", "content": message["content"]})
    assert Checkpoint.from_record(checkpoint.to_record()) == checkpoint


def test_summary_request_carries_the_whole_source_and_the_previous_checkpoint() -> None:
    big = "\n".join(f"measurement {i}: {i * 0.5}" for i in range(3_000))  # ~70 KB, far over 16,000 chars
    source: list[tuple[dict[str, Any], str | None]] = [
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "measure", "arguments": '{"n": 3000}'}}
                ],
            },
            None,
        ),
        ({"role": "tool", "tool_call_id": "c1", "content": big}, "to_big"),
        ({"role": "user", "content": "thanks"}, None),
    ]
    previous = Checkpoint(GOOD.strip(), "h0", 5)
    messages = build_summary_request(source, previous, max_tokens=900)
    assert [m["role"] for m in messages] == ["system", "user"]
    system, user = messages[0]["content"], messages[1]["content"]
    for heading in HEADINGS:
        assert heading in system
    assert "exactly one step" in system and "about 900 tokens" in system
    assert big in user  # complete: not cut again per message
    assert "tool result for c1 (ref=to_big)" in user
    assert 'tool call c1: measure({"n": 3000})' in user
    assert "Previous checkpoint (covers 5 messages)" in user and "RMSE 0.42" in user
    assert user.index("Previous checkpoint") < user.index("Transcript to summarize")


def test_summary_request_without_previous_checkpoint() -> None:
    messages = build_summary_request([({"role": "user", "content": "hi"}, None)])
    assert "Previous checkpoint" not in messages[1]["content"]
    assert "[message 1] user\nhi" in messages[1]["content"]
