"""Capture what client libraries send by default: a tiny OpenAI-shaped server that records bodies.

Not a test: run it in a throw-away venv that has the libraries, and keep its output as the fixture
``<library>-<version>.json`` beside it::

    python3 -m venv /tmp/clients && /tmp/clients/bin/pip install langchain-openai openai-agents litellm
    /tmp/clients/bin/python tests/data/client_requests/capture.py langchain   # or: agents, litellm

tests/integration/test_client_params.py replays every captured body against the proxy.
"""

import asyncio
import importlib.metadata as md
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODIES = []


def reply(stream, tools):
    msg = {"role": "assistant", "content": "ok"}
    if stream:
        chunks = [
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}],
            },
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            },
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        ]
        return "text/event-stream", "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return "application/json", json.dumps(
        {
            "id": "c1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        BODIES.append(body)
        ctype, payload = reply(body.get("stream"), body.get("tools"))
        data = payload.encode()
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=server.serve_forever, daemon=True).start()
BASE = f"http://127.0.0.1:{server.server_address[1]}/v1"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]


def ver(name):
    return md.version(name)


def langchain():
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = ChatOpenAI(model="test-model", base_url=BASE, api_key="sk-x")
    out = {}
    BODIES.clear()
    llm.invoke(MESSAGES)
    out["invoke"] = BODIES[-1]
    BODIES.clear()
    list(llm.stream(MESSAGES))
    out["stream"] = BODIES[-1]
    BODIES.clear()
    llm.bind_tools([add]).invoke(MESSAGES)
    out["invoke_tools"] = BODIES[-1]
    usage = ChatOpenAI(model="test-model", base_url=BASE, api_key="sk-x", stream_usage=True, temperature=0)
    BODIES.clear()
    list(usage.bind_tools([add]).stream(MESSAGES))
    out["stream_tools_usage"] = BODIES[-1]
    BODIES.clear()
    list(llm.bind_tools([add], strict=True, parallel_tool_calls=False).stream(MESSAGES))
    out["stream_tools_strict"] = BODIES[-1]
    return {
        "library": "langchain-openai",
        "version": ver("langchain-openai"),
        "langchain-core": ver("langchain-core"),
        "openai": ver("openai"),
        "requests": out,
    }


def agents():
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    client = AsyncOpenAI(base_url=BASE, api_key="sk-x")
    model = OpenAIChatCompletionsModel(model="test-model", openai_client=client)
    out = {}
    agent = Agent(name="calc", instructions="You are terse.", model=model, tools=[add])
    agent2 = Agent(
        name="calc",
        instructions="You are terse.",
        model=model,
        tools=[add],
        model_settings=ModelSettings(include_usage=True, parallel_tool_calls=True, temperature=0.2),
    )

    async def main():
        BODIES.clear()
        await Runner.run(agent, "What is 2+2?")
        out["run_tools"] = BODIES[-1]
        BODIES.clear()
        result = Runner.run_streamed(agent, "What is 2+2?")
        async for _ in result.stream_events():
            pass
        out["run_streamed_tools"] = BODIES[-1]
        BODIES.clear()
        await Runner.run(agent2, "What is 2+2?")
        out["run_tools_usage_settings"] = BODIES[-1]
        BODIES.clear()
        result = Runner.run_streamed(agent2, "What is 2+2?")
        async for _ in result.stream_events():
            pass
        out["run_streamed_tools_usage_settings"] = BODIES[-1]

    asyncio.run(main())
    return {"library": "openai-agents", "version": ver("openai-agents"), "openai": ver("openai"), "requests": out}


def litellm_client():
    import os

    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm

    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        }
    ]
    out = {}
    for provider in ("openai", "litellm_proxy"):
        kw = dict(model=f"{provider}/test-model", api_base=BASE, api_key="sk-x", messages=MESSAGES)
        BODIES.clear()
        litellm.completion(**kw)
        out[f"{provider}_completion"] = BODIES[-1]
        BODIES.clear()
        list(litellm.completion(**kw, stream=True, stream_options={"include_usage": True}))
        out[f"{provider}_stream_usage"] = BODIES[-1]
        BODIES.clear()
        litellm.completion(**kw, tools=tools, tool_choice="auto")
        out[f"{provider}_tools"] = BODIES[-1]
    return {"library": "litellm", "version": ver("litellm"), "openai": ver("openai"), "requests": out}


which = sys.argv[1]
result = {"langchain": langchain, "agents": agents, "litellm": litellm_client}[which]()
print(json.dumps(result, indent=2, sort_keys=True))
