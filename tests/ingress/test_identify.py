"""Session identity: headers first, then body fields, then a fingerprint stable as the history grows."""

from __future__ import annotations

import pytest

from proxy.ingress.front_door import identify
from proxy.kernel.errors import InvalidRequest
from proxy.kernel.tenancy import Principal, team_of

FIRST = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]


def test_header_wins_over_body_and_fingerprint():
    identity = identify(
        {"x-session-id": "run-1", "x-litellm-session-id": "other"},
        {"messages": FIRST, "metadata": {"session_id": "body"}},
    )
    assert (identity.context_id, identity.source, identity.scope) == ("run-1", "header:x-session-id", "main")


def test_fingerprint_is_stable_as_history_grows_and_differs_by_task():
    short = identify({}, {"messages": FIRST})
    longer = identify(
        {}, {"messages": [*FIRST, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]}
    )
    other = identify({}, {"messages": [FIRST[0], {"role": "user", "content": "another task"}]})
    assert short.context_id == longer.context_id and short.context_id.startswith("fp-")
    assert other.context_id != short.context_id


@pytest.mark.parametrize("given", ["..", ".", "a/b", "x" * 129, "naïve"])
def test_unsafe_ids_become_hashes(given):
    context_id = identify({"x-session-id": given}, {"messages": FIRST}).context_id
    assert context_id.startswith("sid-") and len(context_id) == 36


def test_scope_header():
    assert identify({"x-agent-scope": "Reviewer"}, {"messages": FIRST}).scope == "reviewer"
    with pytest.raises(InvalidRequest, match="x-agent-scope"):
        identify({"x-agent-scope": "root"}, {"messages": FIRST})


def test_codex_session_headers_and_prompt_cache_key_name_the_session():
    from proxy.ingress.front_door import identify as _identify

    uuid = "01a22f96-f2d2-7962-b8fd-d217d73f8ca2"
    assert _identify({"session-id": uuid, "thread-id": "other"}, {"messages": []}).source == "header:session-id"
    assert _identify({"thread-id": uuid}, {"messages": []}).context_id == uuid
    by_body = _identify({}, {"messages": [], "prompt_cache_key": uuid})
    assert (by_body.context_id, by_body.source) == (uuid, "body:prompt_cache_key")
    assert _identify({"x-session-id": "explicit", "session-id": uuid}, {"messages": []}).context_id == "explicit"


def test_the_fingerprint_ignores_cache_marks_and_a_marked_text_part():
    """Clients mark the newest message for caching and move the mark on: the first user message is marked
    on the first turn and not after, and a marked message is a one-part list where it was a string."""
    mark = {"type": "ephemeral"}
    plain = identify({}, {"messages": FIRST})
    marked = identify(
        {},
        {
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "agent", "cache_control": mark}]},
                {"role": "user", "content": [{"type": "text", "text": "task", "cache_control": mark}]},
            ]
        },
    )
    wrapped = identify({}, {"messages": [{"role": "system", "content": [{"type": "text", "text": "agent"}]}, FIRST[1]]})
    assert marked.context_id == plain.context_id == wrapped.context_id
    two_parts = [{"type": "text", "text": "task"}, {"type": "text", "text": "more", "cache_control": mark}]
    unmarked_parts = [{"type": "text", "text": "task"}, {"type": "text", "text": "more"}]
    assert (
        identify({}, {"messages": [FIRST[0], {"role": "user", "content": two_parts}]}).context_id
        == identify({}, {"messages": [FIRST[0], {"role": "user", "content": unmarked_parts}]}).context_id
    )


def test_the_same_session_header_under_two_teams_is_two_sessions() -> None:
    headers = {"x-session-id": "team.beta.s"}  # a team cannot reach another's by naming it
    body = {"messages": [{"role": "user", "content": "hi"}]}
    alpha = identify(headers, body, Principal("alpha", "key-1")).context_id
    assert alpha == "team.alpha.team.beta.s" and team_of(alpha) == "alpha"
    assert identify(headers, body).context_id == "team.beta.s"  # the administrator names any session
