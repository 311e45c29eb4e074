"""The overflow normalizer on the sourced corpus of real provider bodies (tests/provider/data/overflow_corpus.json).

Each entry names its provider, server version and source (an issue thread, or a package's source file).
Every entry is classified; overflows must yield the window the provider states, look-alikes must be named
as the look-alike they are. A subset, including every 5xx overflow, also goes through litellm over loopback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from proxy.kernel.errors import ContextOverflow, ProviderError
from proxy.provider.error_translation import translate_provider_error
from proxy.provider.overflow import detect_overflow, lookalike_reason, provider_message

CORPUS: list[dict[str, Any]] = json.loads((Path(__file__).parent / "data" / "overflow_corpus.json").read_text("utf-8"))
KEYS = {"provider", "server_version", "source", "status", "body", "overflow", "stated_limit", "verbatim", "notes"}
# A look-alike that talks about sizes must be refused for a reason we can name; one that does not (a missing
# model, a bad key, an engine crash) is simply not an overflow.
SIZE_WORDS = re.compile(
    r"\btokens\b|token count|length|size|too (?:long|large|big|many)|exceed|maximum|limit|context", re.I
)
pytestmark = pytest.mark.filterwarnings("ignore:Items? .* `ReadOnly` qualifier:UserWarning")


def _family(entry: dict[str, Any]) -> str:
    return str(entry["provider"]).split(" (")[0]


def _id(index: int) -> str:
    entry = CORPUS[index]
    name = "".join(c if c.isalnum() else "_" for c in _family(entry)).strip("_")
    return f"{index:02d}-{name}-{'overflow' if entry['overflow'] else 'not'}"


INDEXES = range(len(CORPUS))


def test_the_corpus_is_broad_and_sourced() -> None:
    assert len(CORPUS) >= 60
    assert len({_family(e) for e in CORPUS}) >= 15
    assert sum(not e["overflow"] for e in CORPUS) >= 10  # look-alikes that must stay non-overflows
    assert any(e["overflow"] and (e["status"] or 0) >= 500 for e in CORPUS)
    for entry in CORPUS:
        assert set(entry) == KEYS
        assert entry["source"].startswith(("https://github.com/", "pypi:", "git:"))
        assert entry["stated_limit"] is None or entry["overflow"]


@pytest.mark.parametrize("index", INDEXES, ids=_id)
def test_every_corpus_body_is_classified(index: int) -> None:
    entry = CORPUS[index]
    match = detect_overflow(entry["status"], entry["body"], "")
    assert (match is not None) is entry["overflow"], (entry["source"], match)
    if match is None:
        if SIZE_WORDS.search(json.dumps(entry["body"])):
            assert lookalike_reason(entry["status"], entry["body"]) is not None, "a look-alike we cannot name"
    else:
        assert match.limit == entry["stated_limit"], match.rule
        assert match.message and not match.message.startswith("{")  # the provider's words, not a dump


@pytest.mark.parametrize("index", INDEXES, ids=_id)
def test_every_corpus_body_as_raw_text_with_unknown_status(index: int) -> None:
    entry = CORPUS[index]
    raw = entry["body"] if isinstance(entry["body"], str) else json.dumps(entry["body"])
    match = detect_overflow(None, raw, "")
    if entry["status"] == 429:  # only the status said "rate limit" for the plain-text 429s
        assert match is None or not entry["overflow"]
        return
    assert (match is not None) is entry["overflow"]
    assert match is None or match.limit == entry["stated_limit"]


def test_we_recognize_every_overflow_litellm_recognizes(litellm: ModuleType) -> None:
    """litellm's own string check is one signal: whatever it calls an overflow we call one too, unless we
    know it for a look-alike (litellm counts OpenAI's 10 MiB string limit, for one)."""
    checker = litellm.litellm_core_utils.exception_mapping_utils.ExceptionCheckers
    litellm_only = []
    for index, entry in enumerate(CORPUS):
        text = entry["body"] if isinstance(entry["body"], str) else json.dumps(entry["body"])
        if (
            checker.is_error_str_context_window_exceeded(text)
            and detect_overflow(entry["status"], entry["body"]) is None
        ):
            litellm_only.append((index, lookalike_reason(entry["status"], entry["body"])))
    assert all(reason is not None for _, reason in litellm_only), litellm_only


# Through litellm over loopback: every 5xx entry, the look-alikes answered with 413/429, and one body of
# each other shape (plain text, JSON string inside JSON, Gemini's list, TGI's 422, LM Studio's bare string).
LOOPBACK = sorted(
    {i for i, e in enumerate(CORPUS) if (e["status"] or 0) >= 500}
    | {i for i, e in enumerate(CORPUS) if e["status"] in (413, 429) and isinstance(e["body"], dict)}
    | {
        i
        for i, e in enumerate(CORPUS)
        if e["status"] in (400, 422)
        and _family(e) in {"Google Gemini", "vLLM", "Hugging Face Inference API", "LM Studio", "Moonshot", "DeepSeek"}
    }
)


@pytest.mark.parametrize("index", LOOPBACK, ids=_id)
async def test_corpus_bodies_through_litellm(litellm: ModuleType, provider: Any, index: int) -> None:
    entry = CORPUS[index]
    body = entry["body"]
    api_base = provider.add(status=entry["status"], body=body, content_type=None)
    try:
        await litellm.acompletion(
            model="openai/test",
            api_base=api_base,
            api_key="sk-test",
            messages=[{"role": "user", "content": "hi"}],
            max_retries=0,
        )
    except Exception as exc:  # what litellm raised, translated as the proxy does
        error = translate_provider_error(exc)
    else:
        raise AssertionError("the call did not fail")
    assert isinstance(error, ContextOverflow) is entry["overflow"], (type(error), error.message)
    if isinstance(error, ContextOverflow):
        assert error.limit == entry["stated_limit"]
        assert (error.status, error.code) == (400, "context_length_exceeded")  # a 5xx overflow is not retried
    else:
        assert isinstance(error, ProviderError)
        words = provider_message(body)
        assert words is not None and words[:40] in error.message
