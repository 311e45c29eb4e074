"""Real servers on loopback: the scripted provider and the proxy (uvicorn), the OpenAI SDK as client."""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import asyncpg
import jsonschema
import openai
import pytest

import proxy
from proxy.app import create_app
from proxy.kernel.config import ModelRoute, Settings
from proxy.provider.scripted import Reply, ScriptedProvider, serve_in_thread

MODEL = "test-model"


class ProviderHandle:
    """The scripted provider for one test: set ``script``, read ``history``."""

    def __init__(self, provider: ScriptedProvider, url: str) -> None:
        self.provider = provider
        self.url = url

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.provider.history

    def script(
        self, script: Callable[[dict[str, Any]], Reply], context_window: int | None = None, chunk_delay: float = 0.0
    ) -> None:
        self.provider.script = script
        self.provider.context_window = context_window
        self.provider.chunk_delay = chunk_delay


@pytest.fixture(scope="session")
def _provider_server() -> Iterator[tuple[ScriptedProvider, str]]:
    provider = ScriptedProvider(lambda body: Reply(content="ok"))
    with serve_in_thread(provider.app()) as url:
        yield provider, url


@pytest.fixture
def provider(_provider_server: tuple[ScriptedProvider, str]) -> ProviderHandle:
    scripted, url = _provider_server
    scripted.history.clear()
    scripted.script = lambda body: Reply(content="ok")
    scripted.context_window = None
    scripted.token_scale = None
    scripted.prompt_tokens.clear()
    scripted.chunk_delay = 0.0
    scripted.latency = 0.0
    scripted.most_concurrent = 0
    scripted.streams_finished = scripted.streams_abandoned = 0
    return ProviderHandle(scripted, url)


def route_to(provider_url: str, name: str = MODEL, *, window: int = 16_000, max_output: int = 2_000) -> ModelRoute:
    """A model_list entry pointing litellm at the scripted provider, with a ``window``-token input limit."""
    return ModelRoute(
        model_name=name,
        litellm_params={"model": "openai/scripted", "api_base": f"{provider_url}/v1", "api_key": "sk-test-provider"},
        max_input_tokens=window,
        max_output_tokens=max_output,
    )


@dataclasses.dataclass
class ProxyHandle:
    """A running proxy and how to reach it.

    The synchronous SDK clients it makes are closed when the test ends: an unclosed client's socket is
    reported (filterwarnings=error) whenever the garbage collector happens to run, which may be in the
    middle of a later, unrelated test.
    """

    url: str
    settings: Settings
    stop: Callable[[], None] = lambda: None  # stops the server now (a restart, or to open its store)
    clients: list[openai.OpenAI | anthropic.Anthropic] = dataclasses.field(default_factory=list)

    def client(self, **kw: Any) -> openai.OpenAI:
        made = openai.OpenAI(base_url=f"{self.url}/v1", api_key=kw.pop("api_key", "sk-client"), max_retries=0, **kw)
        self.clients.append(made)
        return made

    def anthropic_client(self, **kw: Any) -> anthropic.Anthropic:
        """The official Anthropic SDK pointed at the proxy; ``auth_token=`` sends a bearer header instead."""
        if "auth_token" not in kw:
            kw.setdefault("api_key", "sk-client")
        made = anthropic.Anthropic(base_url=self.url, max_retries=0, **kw)
        self.clients.append(made)
        return made

    def close_clients(self) -> None:
        while self.clients:
            self.clients.pop().close()

    def async_client(self, **kw: Any) -> openai.AsyncOpenAI:
        """Not tracked: an async client belongs to the test's event loop, so the test closes it."""
        return openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=kw.pop("api_key", "sk-client"), max_retries=0, **kw
        )


@pytest.fixture
def start_proxy(tmp_path: Path, provider: ProviderHandle) -> Iterator[Callable[..., ProxyHandle]]:
    """Start a proxy (real uvicorn) with settings overrides; every started proxy stops after the test."""
    stack: list[Any] = []

    running: dict[Any, Path] = {}  # SQLite proxies still serving, by the data folder they hold
    handles: list[ProxyHandle] = []

    def start(**overrides: Any) -> ProxyHandle:
        settings = Settings(**{"data_dir": tmp_path / "data", "models": (route_to(provider.url),), **overrides})
        if settings.store_url is None:
            # One process per SQLite data folder (the product refuses a second): a test that starts the
            # proxy again with other settings gets the earlier one stopped first, as an operator would.
            for earlier, folder in list(running.items()):
                if folder == settings.data_dir and earlier in stack:
                    stack.remove(earlier)
                    earlier.__exit__(None, None, None)
        context = serve_in_thread(create_app(settings))
        url = context.__enter__()
        stack.append(context)
        if settings.store_url is None:
            running[context] = settings.data_dir

        def stop() -> None:
            if context in stack:
                stack.remove(context)
                context.__exit__(None, None, None)

        handle = ProxyHandle(url=url, settings=settings, stop=stop)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.close_clients()
    while stack:
        stack.pop().__exit__(None, None, None)
    validate_traces(tmp_path / "data" / "context-traces")


TRACE_SCHEMA = jsonschema.Draft202012Validator(
    json.loads((Path(proxy.__file__).parent / "runtime" / "trace_schema.json").read_text())
)


def validate_traces(folder: Path) -> int:
    """Every trace a test wrote must match the published schema v5; returns how many were checked."""
    paths = sorted(folder.rglob("turn-*.json"))  # a team's under teams/<team>/
    for path in paths:
        errors = sorted(TRACE_SCHEMA.iter_errors(json.loads(path.read_text())), key=lambda e: list(e.path))
        assert not errors, f"{path}: {errors[0].message} at {list(errors[0].path)}"
    return len(paths)


@pytest.fixture
def legacy_proxy(start_proxy: Callable[..., ProxyHandle]) -> ProxyHandle:
    return start_proxy(mode="legacy")


PG_DSN = os.environ.get("CONTEXT_PROXY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
STORE_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


async def store_url_for(backend: str, prefix: str, pool_size: int, lock_connections: int) -> AsyncIterator[str | None]:
    """``None`` (the SQLite default) or the URL of a fresh PostgreSQL schema, dropped afterwards.

    Small pools: the server is shared with other test runs. Use as the body of a ``store_url`` fixture
    parametrized over ``STORE_BACKENDS``.
    """
    if backend == "sqlite":
        yield None
        return
    try:
        conn = await asyncpg.connect(PG_DSN, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PostgreSQL at {PG_DSN} is not reachable ({exc}); CI=true requires it")
        pytest.skip(f"PostgreSQL at {PG_DSN} is not reachable ({exc})")
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{PG_DSN}?schema={schema}&pool_size={pool_size}&lock_connections={lock_connections}"
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()
