"""The CJK cost table is exactly what tiktoken says today."""

from proxy.context.cjk_costs import RANGES, cost_table, generate_packed


def test_table_matches_the_tokenizers() -> None:
    from proxy.context import cjk_costs

    assert generate_packed() == "".join(cjk_costs._PACKED)


def test_table_covers_the_ranges_with_costs_one_to_three() -> None:
    table = cost_table()
    assert len(table) == sum(stop - start for start, stop in RANGES)
    assert set(table.values()) <= {1, 2, 3}
    assert table["的"] == 1  # the most frequent character is one token in both encodings
