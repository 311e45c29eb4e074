"""The ``team`` label of the metrics stays bounded: the busiest teams by name, the rest ``other``."""

from __future__ import annotations

from proxy.observe.team_labels import OTHER, TeamLabels


def test_every_team_is_named_while_there_are_no_more_than_the_limit() -> None:
    labels = TeamLabels(3)
    assert [labels.label(c) for c in ("team.a.s", "team.b.s", "s", "team.a.t")] == ["a", "b", "default", "a"]


def test_a_quiet_team_beyond_the_limit_is_other_and_a_busy_one_gets_its_name() -> None:
    labels = TeamLabels(2)
    for _ in range(5):
        labels.label("team.a.s")
        labels.label("team.b.s")
    assert labels.label("team.c.s") == OTHER  # one call against the busiest two's five
    for _ in range(10):
        last = labels.label("team.c.s")
    assert last == "c"  # now among the two busiest


def test_at_most_twice_the_limit_teams_are_ever_named() -> None:
    labels = TeamLabels(2)
    named = set()
    for round_ in range(1, 30):
        team = f"team.t{round_}.s"
        for _ in range(round_ * 3):  # each new team is busier than every one before it
            named.add(labels.label(team))
    assert len(named - {OTHER}) == 4 and OTHER in named
