"""Worst-case token costs of CJK characters under tiktoken's ``cl100k_base`` and ``o200k_base``.

For every code point in :data:`RANGES` the table holds the larger of the two encodings' token counts
for that character on its own (1, 2 or 3). Summing these costs bounds a CJK run from above: a frequent
character such as 的 costs 1, a rare one 3, so common research text is not charged the 3-byte worst
case. The table is data, generated from the tokenizers; ``tests/context/test_cjk_costs.py`` regenerates
it and fails if it is stale. Regenerate with ``python -m proxy.context.cjk_costs > new.txt``.
"""

from __future__ import annotations

import base64
from functools import cache

# Half-open code-point ranges covered, in table order: CJK punctuation + kana, unified ideographs,
# full-width forms.
RANGES: tuple[tuple[int, int], ...] = ((0x3000, 0x3100), (0x4E00, 0xA000), (0xFF00, 0xFFF0))


def generate_packed() -> str:
    """Recompute the table from tiktoken (needs the encodings offline) as base64 of 2-bit costs."""
    import tiktoken  # local import: only the generator and its test need the tokenizers

    encodings = [tiktoken.get_encoding(name) for name in ("cl100k_base", "o200k_base")]
    costs = [max(len(enc.encode(chr(cp))) for enc in encodings) for start, stop in RANGES for cp in range(start, stop)]
    packed = bytearray((len(costs) + 3) // 4)
    for i, cost in enumerate(costs):
        packed[i // 4] |= cost << (2 * (i % 4))
    return base64.b64encode(bytes(packed)).decode("ascii")


@cache
def cost_table() -> dict[str, int]:
    """Character -> worst-case token cost, for every character in :data:`RANGES` (decoded once)."""
    packed = base64.b64decode(_PACKED)
    table: dict[str, int] = {}
    i = 0
    for start, stop in RANGES:
        for cp in range(start, stop):
            table[chr(cp)] = (packed[i // 4] >> (2 * (i % 4))) & 3
            i += 1
    return table


# fmt: off
_PACKED = (
    "lapaVaWqqqmqqqqqqqqqqpqZWWVmVWVmZVlVWqmqqlqWqVVlWqqqqlpZWWZpZlVqZVpVqmVVmpZlZlalaqpqqalqVpZqqpqpqqma"
    "ppqqWqqqqmWqqqqqaqqaqqqqqqqqqppqmaqpaqqqaWqpqqqaaqqqWpqqmqmqaqaqqapaaqamqqqqqqqZqqmqqqqqqqqqqpqqpmqm"
    "pqmpqqqqqqqqaqqqaqqqqmqqpqqqqqqqqqqqqqqqqqqqpqaqqpqqqqqqqqqqpqqqqqqqqqqqqqqqqaqqqqqqqqqpqqqqqqqqqqr/"
    "///////////+/vr///v/qqqqaqqqqqqqqqqqqqqqqv////////////////////9qqqmqqqqqqqqmqalmWqqqqpaqpaqqpqqqqqqq"
    "qqqqqqqqqqqqqqqqqqqqqqqqWqqqmqqqqmqmpqqqZqqpmqqqqqqqpqqqqqqqqqqqqqqqqqqqqqqqqmpqpaqpqqqqqqqqqqqqqqaq"
    "qqqqqqqqqqqqqqaqqqpaqqqqqqqqqqqaqqaqqZqqZqqqqqqqqmqqqqqqmqqqqqqqaqqqqqqqqmpqmqpapqaaqapqqppqaWqpqqqq"
    "qZWmqqqqqppqaaqqqqqqqpqqqqqpqqqqqaqqqqqm/////f///////////////6aqqaqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq"
    "qqqqqpqqaqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqr///+//////////////////////////////////////+//////////"
    "///9///////////+////////////////qqqqqqqqapqpqqqqqqqqlqqqqqqqqqpqqqqpqqmqmqqpqqqqqqqqqqqqqqqqqqqq//9/"
    "/////////////////6qqqpqqqqqqqqqqqqqqmqqqqqqqqqqqqqqqqqqmqaqqqqqqqqqqqqqqqmqqqqqqqqqqqqqqqqqaqqqqqqqq"
    "qqqqqqqqqqqqqqqqqqqpqqqqqmmqpqqamqqqaqaqpqmqqqqqqqqqqqqqqqqqqmqqqqbf//////////////7/////qqpqqqqqqqqq"
    "qqqqqqqqqv//////////+////////////////////////////////////v////////////////////////7////////////7////"
    "/////////////v7/qqqqqqlqqaqqmqqqqqqqqqqqZqmqqpqalqqqqqqapqqqmqqqqqqqqqqqqqqqqqapqpqqaqapqqqqqqqqpqqq"
    "qqmqqqqqpqqqqqqqqqaqqqqmqqqqqqqqqqqqqqqqqqqq//////////////////+///7//v///////////////////////////v//"
    "/////////////////////////////6qqqqqqqqqaqpaqqpqqqqpaqqqqqqqqqqqqqqqqqqmqqqqqqqqqqqqqqqqqapmqaqqqqmpq"
    "aaqqqpqqqqqqqqqqqqqqqqqqqqqqqqqqqpqqmaqqaqqmqqqpqqqqqqqqqqqqqqpqpqqqmqqqqqaqqqqqpaqpqmqqqqqqqpqqqqqq"
    "aqaqqqpqqqqqqqqqqqqqqqaqqqqqqqqmqmqqqqqqaqqqqqqqqqqqqqqqqmqqqqqq/////////////v36///7/6qmqqqqqqqqqqqq"
    "qqqqqqqqqqpqqqqqaqqqqqqqqqqq////+v//////v//////////////////////////7////////////////////////qqqqqqWa"
    "qqqqqqqqqmqqqqmqaqpqqqqqqqqqqqqqqpqpqqqqqqaqqqqmqqqqqqqqqqqmqqqqqqqqqqqqqqqqqqZqpqqqqqqqqqqqqqqqqqqq"
    "qqqqqqqqqpqqqpqqqqqqqqqqqpqqqqqqpqmqqqqqqqqqqqqpqqqqqqqqqqqqqqr//////////v//////////qqqqqqqqqqqqqqqq"
    "qqqqqqqqqqqqqqqqqqqqpqqqqqr////7///+////////////qqqqqqqqqqqqqqpqqpqmWqqqqaqqqqqqqqqqqqmpqqqqaqqqqqqm"
    "qqqqqqapqqaqqqqqaqqqqqqppqqqqpqqqqqqqppqqqpqqqqqaqqqqqqaqqqqqqqqqqqqqmqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq"
    "qqqqqqqqqqqqqqqpqqqpqqWmqqqqaqqqmamqqpqqaqqqqqqqqmqmpqqqqqqqaqqpqqqpqqqpqqqqqqqqqqqqqqqqqqqqqqqmqqqq"
    "qqqqqmqqqqqqqqqqqqqqqmqpqaqqqaqqqqqqqqqqqqqqqqr/////////////////////qaqqqqqqqqqqqqqqqqqqqv//////////"
    "//////////+qqqqqqqqqqqqqqqqqqqqq7//////////////+//////////////////////////////////////f/////////////"
    "//////////////////////7////////////////////////+////////////qqqqqqqqqqqmqqqqqqqqmqqqqqqqqqqqWqWqqmqq"
    "qqqqqqqqqqqqqqqqqqqqpqqqqqqqaqqpqqqqqqqqqqqqqqqqqqqmaqqqqqqqqqqpqqqaqqqqqqqqaqqqqqqqqqqmqqqqqqqqqqqm"
    "qqqqqqpqqqqqqqqqpqqqqqqpqqqqqqqqqqqqqqqqqqqqqqqqqmqqpqqqqqqqqqqqqqqqqmqqqqqqqaqqqqqqqqqqqqqqqqqqqqqq"
    "qqqqqqqqqqqqqqqqqqaqqqqqqqqqqqqqqqqpqqqqqqqqqqqqqqqqqqqqqqqqqqqqqaqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq"
    "qqqqqqqqqqqqqqqqqqqqqqr///////7/////////////////////////////////////////////////////////////////////"
    "////////qqqqqqqqqqqqqmqqqqqqqv////////////7++v//9//7////////+//////////7qqqqqqqqqqqmqqqqqpqqqv////r/"
    "/////7//////////////////////////+////////////////////////6qqqqqqqqqqqqqqqqqqqqqqaqmqqqqqqqqqpqqqqqaq"
    "/////////////////+/////////////////////////+/////////////v///////////////////////v///6pqqqqqqqqqqqqq"
    "aqmqqqqqqqqqqqqqqqqqqqqqqqqqapqqqqqqqqqqqqqqqqqqqv/////+///+///////////////+////////////////////+///"
    "/v///////////6qqqqqqqqpqqqqpqqZmaqqqqqqpqqqqqqqqmqqqqqqq///7/////////////////////7//////////////////"
    "////////////////////qqqqqqqqqqqqqqqqqqpqqqqpqqqqqqqqqqqqqqqqqqqqqqqqpqqqqqqqqpqqqamqpqpqqaqqqmqqqqqq"
    "qqqqqqqqqqqqqqqqqqqqqqqqqqr//7//////////////////////////////9///v/////b///////////////////+qqqqqqqqq"
    "qqqqqpqqqqqqqqqqqqqqqqqqqqqqqqqqqv////////////////////6qqqqqqqqqqqqqqqqqqpqaqqqqqqqqqqqqqqmqqqqqqqqq"
    "qqqqqqqqqqqqqqqqqqqmqqqmlqqqqqqqqqqpqmqqqqpqlqqqqqqqqqqqqqqqaqqqqqqqqqqqqqqqqqqqmqqqqqqqqqqqqqqqqqqq"
    "qqqqqqpqqqqqpqqpqqpqqqqqqqqqqqqmqqqqqpqqqaqqqqqqqqaqqqqqqqqqqqqqqqqaqaqqqqpqqqqmqqqqpqqqqqqqqqqqqqqq"
    "qqqqqqqqqqr/////////////////////qqqqqqqqqqqqqqqqaqpqqqqqqqqqqqqqqqqqqqqqqqr//////////////////3//qqqq"
    "qqqqqqqZqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqr///7////v//////////////////////////7///++////////////////////"
    "/////v//////////////////qqqqqqqqqqqqWqqqqqqqaqqpqmpqqqZpqqqqqqqqqqqqqqqqqpqqqqqqqqqqqqqqqqqqqqaqqqqq"
    "qqqaqqqqqqqqqpqqqqqqqqqqqqqqqqr/////////////////////Zqaqqaqqqqqqqqqqqqqqqqqqqqqqqaqqqqqqqqqqqqqqqqqq"
    "qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqpv/////////////////////////6//////+///////////////////////////v/"
    "/6qqqqqqqqqqqqqaqmqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqmqqqqpqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq"
    "qqqmqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqr/////////////////v///qqqqqqqqqqqqqqqqqqqqqqqqqqqq"
    "qqqqqqqqqqqqqqr//////v///v///////////////v////////////////////v///7//////////////v//////////////////"
    "/////v//////////////////+/////////////////////9//////////////////////////////////////6qqqqqqqqqqqqqq"
    "qqqqqqr////+//////////////////7////////////////////////////////////////////////////////////+//+/////"
    "//////////////////////////v//7/////+////////////////////qqqqqaqqqqqqqqmqqqqqqqqqqqqqqqqqqqqqqqqqqqqq"
    "pqqqqqqqqqqqqqqqqqqq/////////////////////////////////////////3+mqmqqqqqqqqqqqqqqqqqqppmqqpqqqqpqqqqq"
    "qqqqqqmqqaqqqqmqqqqqqqqqqqqqqqqqqqqqqqqqqqqmqqqqqqqqqqqqqqqqqqqmqqqqqv////////7////////////7////////"
    "/////////v7/qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqpqmqmqmqmpqmqaqqqqaqppqWqmaqaWqqaqqqqqqqqqqqqqqqqqqqqqqq"
    "qqqqqqqqpqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqalaqpqqqpqqqqaqqqqqqqqqqqqqq"
    "aqqqqqaqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqaqqqqqr///////////////////////7/////////////////////////////"
    "//9///////////////////////////+//////////////////////6qqqqqqqqqqqpqqaaqqqqaqqqqqZqqqqqqqqqqqqqqaqmqq"
    "qqWqZZqqqqqqqaqqqqWqpqqqqppqaaqqqqqqqqqqqqqqaqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqaqqqqqqqqqqqqqqqqqqqpqqqq"
    "qqb/////////////////////////9v//////v//////////////////////////7//+qqpplpqqqqqqqqqqqqqqq/////////v//"
    "////////////////////////////////////////////////7////////////////////////6qqqqqqqqqqqqqqqqqqqqr/////"
    "///////////+/////////////////////7///////////////////////////////////v////////////////7///7/////////"
    "/6qqqqqqqqpqqqqqmqqqqqqqqqqqqqqqqqqqqqqqqqqaqaqqqqqqpqqqqqqaqqqqqqqqqqqqqqqqqqqqqqqqqmqqqmqqaqqqqpqq"
    "qqqqqqqqqqqqqqqqqqqqqqmWqqmqqqqqqqqqqqpqqqqqqmqqqqqqmqqqqaqqqpqpqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqWqqqq"
    "qqqqqqqqqqpqqqqpqqqqqqqqqqqqqqqqqqqqqqqqqqqqqpqaqqqqqqqqqv//v//////////////////////////////7//9/////"
    "qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqmpqqqqaqqpqqppqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqv//////////////"
    "//////////////////////////+/qqqqqqqaqqqqqqqqqqqqqv////////////////////////////////v/////////qqqqqqqq"
    "qqqqqqqqqqqqqv////3////////////////////////9////////////+/////////////////7+///////+////////////////"
    "////////////////////////////////////////////////////////////////////////////////////////////////////"
    "////////////////////////v//+//////////////////////////////7/////////////////////////////////////////"
    "/////v////7////////////////////////+////////////////////////////////v///////qqqqqqaqqqqqqqqqqqqqqv//"
    "//////////////////////////7/////////////qqqqqqqqqqqqqqqqqqqqqv////////////////////+mqqVVVVVVWqqqqqqq"
    "qqqaqqqqqqqqqpqqpqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqmqqo="
)
# fmt: on


if __name__ == "__main__":
    print(generate_packed())
