"""read_tool_output: query, line range, char range, and the errors that name the right form."""

import json

import jsonschema
import pytest

from proxy.context.tool_output_reader import (
    READ_TOOL_OUTPUT,
    READ_TOOL_OUTPUT_SCHEMA,
    ReaderLimits,
    read_body,
    read_tool_output,
)

BODY = "\n".join(f"row {i}: value={i * 7}" for i in range(1, 301))
WIDE = '{"items":[' + ",".join(f'{{"id":{i},"v":"k{i}"}}' for i in range(10_000)) + "]}"


class FakeStore:
    """One session's stored bodies; records every lookup."""

    def __init__(self, bodies: dict[str, str]) -> None:
        self.bodies = bodies
        self.history: list[str] = []

    async def get(self, ref: str) -> str | None:
        self.history.append(ref)
        return self.bodies.get(ref)


def test_schema_is_an_openai_function_tool() -> None:
    assert READ_TOOL_OUTPUT_SCHEMA["type"] == "function"
    function = READ_TOOL_OUTPUT_SCHEMA["function"]
    assert function["name"] == READ_TOOL_OUTPUT == "read_tool_output"
    jsonschema.Draft202012Validator.check_schema(function["parameters"])
    validator = jsonschema.Draft202012Validator(function["parameters"])
    assert validator.is_valid({"ref": "to_1", "query": "x"})
    assert not validator.is_valid({"query": "x"})


def test_query_returns_matching_lines_with_numbers() -> None:
    out = read_body(BODY, {"query": "value=700"})
    assert out.startswith("1 line(s) contain 'value=700'")
    assert "\n100: row 100: value=700" in out


def test_query_is_literal_and_case_sensitive() -> None:
    assert "no line contains" in read_body(BODY, {"query": "ROW 1"})
    assert "no line contains" in read_body(BODY, {"query": "row .*"})  # not a regex
    assert "300 lines" in read_body(BODY, {"query": "nothing"})  # tells the shape for a line range


def test_query_is_capped_in_count_and_chars() -> None:
    out = read_body(BODY, {"query": "row"}, ReaderLimits(max_matches=5))
    assert out.startswith("300 line(s) contain 'row'; showing the first 5")
    assert len(out.split("\n")) == 6
    out = read_body(BODY, {"query": "row"}, ReaderLimits(max_chars=100))
    assert len(out) < 300


def test_query_on_a_wide_line_shows_windows_with_char_offsets() -> None:
    out = read_body(WIDE, {"query": '"id":4242,'})
    start = WIDE.index('"id":4242,')
    assert f"1 [chars {start - 160}-" in out
    assert '"v":"k4242"' in out
    assert len(out) < 1_000


def test_line_range_is_inclusive_and_bounded() -> None:
    out = read_body(BODY, {"start_line": 10, "end_line": 12})
    assert out.split("\n") == [
        "lines 10-12 of 300:",
        "10: row 10: value=70",
        "11: row 11: value=77",
        "12: row 12: value=84",
    ]
    out = read_body(BODY, {"start_line": 1, "end_line": 300}, ReaderLimits(max_lines=20))
    assert out.startswith("lines 1-20 of 300 (answer bounded; continue with start_line=21)")
    assert read_body(BODY, {"start_line": 299, "end_line": 400}).startswith("lines 299-300 of 300:")


def test_line_range_on_one_huge_line_says_to_use_chars() -> None:
    body = "x" * 200_000
    out = read_body(body, {"start_line": 1, "end_line": 1})
    assert out.startswith("error: this output is one line of 200,000 characters; use start_char/end_char")


def test_char_range_reads_a_wide_line_bounded() -> None:
    out = read_body(WIDE, {"start_char": 100, "end_char": 160})
    assert out == f"chars 100-160 of {len(WIDE):,}:\n" + WIDE[100:160]
    out = read_body(WIDE, {"start_char": 0, "end_char": 100_000}, ReaderLimits(max_chars=500))
    assert out.startswith(f"chars 0-500 of {len(WIDE):,} (answer bounded; continue with start_char=500)")
    assert out.endswith(WIDE[:500])


def test_char_range_on_ordinary_lines_says_to_use_lines() -> None:
    out = read_body(BODY, {"start_char": 0, "end_char": 100})
    assert out.startswith("error: this output has no over-wide line; use start_line/end_line or a query")


def test_wide_line_inside_a_line_range_points_to_chars() -> None:
    body = "first\n" + "z" * 5_000 + "\nlast"
    out = read_body(body, {"start_line": 1, "end_line": 3})
    assert "2: " in out and "[line of 5,000 characters at chars 6-5006; read it with start_char/end_char]" in out
    assert "3: last" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "error: give exactly one of: query, or start_line and end_line, or start_char and end_char"),
        ({"query": "row", "start_line": 1, "end_line": 2}, "error: use only one of"),
        ({"start_line": 3}, "error: a line range needs both start_line and end_line"),
        ({"end_char": 3}, "error: a character range needs both"),
        ({"start_line": 5, "end_line": 2}, "error: need 1 <= start_line <= end_line"),
        ({"start_line": 301, "end_line": 302}, "error: start_line 301 is past the end; this output has 300 lines"),
        ({"start_line": "x", "end_line": 2}, "error: start_line must be an integer"),
        ({"query": 5}, "error: query must be a string"),
        ({"pattern": "row"}, "error: unknown argument(s) pattern"),
    ],
)
def test_wrong_forms_get_a_helpful_error(args: dict[str, object], expected: str) -> None:
    assert read_body(BODY, args).startswith(expected)


def test_numeric_strings_are_accepted_as_line_numbers() -> None:
    assert read_body(BODY, {"start_line": "2", "end_line": "2"}) == "lines 2-2 of 300:\n2: row 2: value=14"


async def test_reads_through_the_source_port() -> None:
    store = FakeStore({"to_aa": BODY})
    out = await read_tool_output(store, json.dumps({"ref": "to_aa", "query": "value=21"}))
    assert "3: row 3: value=21" in out
    assert store.history == ["to_aa"]


async def test_unknown_or_foreign_ref_reads_as_unknown() -> None:
    store = FakeStore({"to_aa": BODY})  # another session's ref is simply not in this session's store
    out = await read_tool_output(store, {"ref": "to_other_session", "query": "x"})
    assert out == "unknown reference ref=to_other_session: no stored output of this session has it."


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("{not json", "error: the arguments are not valid JSON"),
        ("[1]", "error: the arguments must be a JSON object"),
        ('{"query": "x"}', "error: ref is required"),
        ('{"ref": "to x", "query": "x"}', "error: 'to x' is not a reference"),
    ],
)
async def test_bad_arguments_never_reach_the_store(arguments: str, expected: str) -> None:
    store = FakeStore({})
    assert (await read_tool_output(store, arguments)).startswith(expected)
    assert store.history == []
