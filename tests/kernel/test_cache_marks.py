"""Which prompt-cache marks stay: the proxy's, then the client's newest message marks, then its tool marks."""

from __future__ import annotations

from proxy.kernel.cache_marks import Mark, kept

PROXY, CLIENT, TOOL = Mark(proxy=True), Mark(proxy=False), Mark(proxy=False, tool=True)


def test_everything_stays_within_four() -> None:
    assert kept([TOOL, PROXY, CLIENT, CLIENT]) == [True, True, True, True]


def test_the_clients_oldest_message_marks_go_first_then_its_tool_marks() -> None:
    assert kept([TOOL, PROXY, CLIENT, PROXY, CLIENT, CLIENT]) == [False, True, False, True, True, True]
    assert kept([TOOL, TOOL, PROXY, PROXY, CLIENT]) == [False, True, True, True, True]


def test_the_proxys_marks_always_stay() -> None:
    assert kept([CLIENT, PROXY, PROXY], limit=2) == [False, True, True]
