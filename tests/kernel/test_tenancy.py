"""Team names, a team's context ids and trace folders (``proxy/kernel/tenancy.py``)."""

from __future__ import annotations

from pathlib import PurePath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.kernel.tenancy import ADMIN, Principal, check_team, team_context_id, team_of, trace_folder

SAFE_IDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=128)


@given(team=st.from_regex(r"[a-z0-9][a-z0-9_-]{0,31}", fullmatch=True), session=SAFE_IDS)
def test_a_teams_context_id_is_its_own_fits_the_pattern_and_names_its_team(team: str, session: str) -> None:
    if team == "default":
        return
    context_id = team_context_id(team, session)
    assert len(context_id) <= 128 and context_id.startswith(f"team.{team}.")
    assert team_of(context_id) == team
    assert trace_folder(context_id) == PurePath("teams", team, context_id)
    assert Principal(team, "key-1").owns(context_id) and ADMIN.owns(context_id)
    assert not Principal("other", "key-2").owns(context_id)


def test_the_default_teams_ids_are_unprefixed_and_its_traces_where_they_were() -> None:
    assert team_context_id("default", "s") == "s" and team_of("s") == "default"
    assert team_of("team.Bad Name.s") == "default" and trace_folder("s") == PurePath("s")


@pytest.mark.parametrize("name", ["", "default", "Upper", "a.b", "x" * 33, "-lead"])
def test_bad_team_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        check_team(name)
