"""Ids the proxy minted are paired between a recording and its replay; relayed ids are left alone."""

from __future__ import annotations

from proxy.replay.replay import IdMap

OLD, NEW = "resp_" + "a" * 24 + "science", "resp_" + "b" * 24 + "science"
RELAYED = "fc_" + "c" * 24


def test_minted_ids_are_paired_by_order_and_relayed_ones_are_not():
    ids = IdMap()
    ids.learn(f'{{"id": "{RELAYED}", "x": "{OLD}"}}', f'{{"id": "{RELAYED}", "x": "{NEW}"}}')
    assert ids.ids == {OLD[:29]: NEW[:29]}  # the id proper: its hex part, not the context id after it
    assert ids.forward(f'{{"previous_response_id": "{OLD}"}}') == f'{{"previous_response_id": "{NEW}"}}'
    assert ids.forward(RELAYED) == RELAYED
