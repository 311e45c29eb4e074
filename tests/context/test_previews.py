"""Tool-body previews: head/tail, plain ref=, deterministic, never larger than the body."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.previews import (
    REF_MENTION,
    PreviewMemo,
    PreviewPolicy,
    is_preview,
    preview_message,
    refs_in,
    render_preview,
)

REF = "to_3f9a1c0011223344"
H1, H2 = "1" * 64, "2" * 64  # chain hashes of two stored tool messages


def _body(lines: int, width: int = 30) -> str:
    return "\n".join(f"line {i:04d} " + "x" * width for i in range(1, lines + 1))


def test_multi_line_preview_keeps_head_and_tail_and_names_the_ref() -> None:
    body = _body(310)
    text = render_preview(body, REF)
    assert text is not None and is_preview(text)
    header = text.split("\n", 1)[0]
    assert f"{len(body):,} chars, 310 lines" in header
    assert f"ref={REF}," in header  # plain ref=, no brackets
    assert REF_MENTION.search(header)
    assert "line 0001" in text and "line 0310" in text
    assert "line 0150" not in text
    assert "[lines 9-302 omitted]" in text


def test_single_wide_line_shows_first_and_last_chars_with_char_offsets() -> None:
    body = '{"data":[' + ",".join(str(i) for i in range(40_000)) + "]}"
    text = render_preview(body, REF)
    assert text is not None
    assert "1 line; first/last characters" in text
    assert f"[chars 600-{len(body) - 600} omitted]" in text
    assert body[:600] in text and body[-600:] in text
    assert len(text) < 1_500


def test_small_body_is_not_previewed() -> None:
    assert render_preview("ok\n42", REF) is None
    assert render_preview("x" * 1_000, REF) is None  # shorter than head + tail


def test_invalid_ref_is_refused() -> None:
    with pytest.raises(ValueError):
        render_preview(_body(100), "to x")


def test_preview_message_keeps_the_structure() -> None:
    message = {"role": "tool", "tool_call_id": "call_7", "name": "run", "content": _body(200)}
    out = preview_message(message, REF)
    assert out is not None
    assert {k: v for k, v in out.items() if k != "content"} == {k: v for k, v in message.items() if k != "content"}
    assert preview_message(out, REF) is None  # a preview is never previewed again


def test_content_parts_are_read_as_text() -> None:
    message = {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": _body(200)}]}
    out = preview_message(message, REF)
    assert out is not None and isinstance(out["content"], str) and "line 0200" in out["content"]


def test_long_lines_are_clipped_in_the_preview() -> None:
    body = "\n".join("y" * 5_000 for _ in range(50))
    text = render_preview(body, REF, PreviewPolicy(line_chars=100))
    assert text is not None and max(len(line) for line in text.split("\n")[1:]) <= 100


def test_refs_in_finds_plain_mentions_without_trailing_punctuation() -> None:
    text = "see ref=to_abc. and ref=to_def:, again ref=to_abc; not xref=to_zzz"
    assert refs_in(text) == ["to_abc", "to_def"]


@settings(max_examples=50, deadline=None)
@given(
    body=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=3_000),
    # A mention cannot end in "." or ":" (read as sentence punctuation); the store's refs never do.
    ref=st.from_regex(re.compile(r"[A-Za-z0-9_.:-]{0,19}[A-Za-z0-9_-]"), fullmatch=True),
)
def test_previews_are_deterministic_and_shorter(body: str, ref: str) -> None:
    first = render_preview(body, ref)
    assert first == render_preview(body, ref)
    if first is not None:
        assert len(first) < len(body)
        assert is_preview(first)
        assert ref in refs_in(first)


def test_preview_memo_gives_what_preview_message_gives_as_a_dict_of_its_own() -> None:
    memo = PreviewMemo(PreviewPolicy())
    body = "\n".join(f"line {i}" for i in range(100))
    message = {"role": "tool", "tool_call_id": "c1", "content": body}
    first = memo.preview_message(message, H1, "r1", reader="reader")
    again = memo.preview_message(message, H1, "r1", reader="reader")
    assert first == again == preview_message(message, "r1", PreviewPolicy(), reader="reader")
    assert first is not again  # a caller may change its copy without touching the next caller's
    assert memo.preview_message({"role": "tool", "tool_call_id": "c2", "content": "short"}, H2, "r2") is None
    # Another reader's name is another preview.
    assert memo.preview_message(message, H1, "r1", reader="other") == preview_message(message, "r1", reader="other")


def test_preview_memo_keeps_at_most_its_bound_dropping_the_least_recently_used() -> None:
    memo = PreviewMemo(PreviewPolicy(), max_entries=2)
    long = {"role": "tool", "tool_call_id": "c", "content": "\n".join(str(i) for i in range(100))}
    memo.preview_message(long, H1, "a")
    memo.preview_message(long, H1, "b")
    memo.preview_message(long, H1, "a")  # a is now the most recently used
    memo.preview_message(long, H1, "c")
    assert len(memo) == 2
    # b went; a still answers from the memo: a body it is handed now is not read again.
    assert memo.preview_message({"role": "tool", "content": "x"}, H1, "a") is not None
    assert memo.preview_message({"role": "tool", "content": "x"}, H1, "b") is None


def test_a_named_preview_is_named_by_its_reference_reader_and_policy() -> None:
    long = {"role": "tool", "tool_call_id": "c", "content": "\n".join(str(i) for i in range(100))}
    memo = PreviewMemo(PreviewPolicy())
    named = memo.named_preview(long, H1, "a")
    assert named is not None and named[0] == preview_message(long, "a")
    assert memo.named_preview(dict(long), H1, "a") == named  # the same name on every turn
    names = {
        named[1],
        memo.named_preview(long, H1, "b")[1],  # type: ignore[index]
        memo.named_preview(long, H1, "a", reader="other")[1],  # type: ignore[index]
        memo.named_preview(long, H2, "a")[1],  # type: ignore[index]  # another body under a colliding ref
        PreviewMemo(PreviewPolicy(head_lines=2)).named_preview(long, H1, "a")[1],  # type: ignore[index]
    }
    assert len(names) == 5 and all(len(name) == 64 for name in names)


def test_the_preview_memo_tells_bodies_apart_by_chain_hash_even_under_one_reference() -> None:
    memo = PreviewMemo(PreviewPolicy())
    first = {"role": "tool", "tool_call_id": "c", "content": "\n".join(f"first {i}" for i in range(100))}
    second = {"role": "tool", "tool_call_id": "c", "content": "\n".join(f"second {i}" for i in range(100))}
    assert memo.preview_message(first, H1, "to_0") == preview_message(first, "to_0")
    assert memo.preview_message(second, H2, "to_0") == preview_message(second, "to_0")
