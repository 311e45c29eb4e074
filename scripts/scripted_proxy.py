#!/usr/bin/env python3
"""Serve the real proxy (``python -m proxy serve``) in front of a scripted model that drives an agent task.

For ``scripts/real_agents.py --scripted-proxy``: the real agents (Codex CLI, Claude Code) talk to the
real proxy over loopback, and the proxy's provider is ``proxy/provider/scripted.py`` playing a model
that makes ``--steps`` shell tool calls (``exec_command`` for Codex, ``Bash`` for Claude Code, whichever
the request offers), each ``echo step-N; <command>``, then answers with a final line. The step count is
read back from the history the proxy sent (tool calls, their outputs, checkpoints), so it survives the
proxy's compaction and Codex's own. The proxy's checkpoint requests are answered with a well-formed
checkpoint naming the steps done. Run with the project's virtualenv:

    .venv/bin/python scripts/scripted_proxy.py --port 4000 --steps 6 --command 'seq 1 5000' --window 16000

It prints ``READY <base-url> <data-dir>`` once the proxy answers, then serves until interrupted.

``--native`` routes the agents' models natively instead: every ``claude-*`` name to an ``anthropic/`` route
in front of the strict Anthropic stand-in (``proxy/provider/scripted_anthropic.py``: it signs its thinking
and refuses what Anthropic refuses), every ``gpt-*`` name to an ``api: responses`` route in front of the
strict Responses stand-in (``scripted_responses.py``: sealed reasoning, ``store``). The same task model
plays both, thinking (a signed thinking block before each answer) or reasoning (a reasoning item first)
when the request asks for it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from proxy.provider import scripted_anthropic as anthropic
from proxy.provider import scripted_responses as responses
from proxy.provider.science_script import SUMMARY_MARKER, is_summary_request
from proxy.provider.scripted import Reply, ScriptedProvider, ToolCall, free_port, serve_in_thread

# The names the agents ask for by default; each is routed to the scripted provider.
MODELS = ("gpt-5.5", "gpt-5.4", "claude-opus-4-8", "claude-sonnet-4-5", "claude-haiku-4-5", "claude-sonnet-4-6")
FINAL_PREFIX = "Done:"
LOCAL_COMPACTION_PROMPT = "CONTEXT CHECKPOINT COMPACTION"
_STEP = re.compile(r"step-(\d+)")


class AgentTaskModel:
    """The scripted model: ``steps`` shell calls, then a final line; checkpoints on request."""

    def __init__(self, steps: int, command: str) -> None:
        self.steps = steps
        self.command = command
        self.requests: list[str] = []  # what each answer was, for the log

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        done = _steps_done(messages)
        if is_summary_request(body):
            self.requests.append("checkpoint")
            return Reply(content=_checkpoint(done))
        last = messages[-1] if messages else {}
        if LOCAL_COMPACTION_PROMPT in _text(last.get("content")):
            self.requests.append("codex-local-summary")
            return Reply(content=f"Summary: steps 1..{done} of the task ran (step-{done} printed its output).")
        tool = _shell_tool(body.get("tools") or [])
        if tool is None or done >= self.steps:
            self.requests.append("final")
            return Reply(content=f"{FINAL_PREFIX} ran {done} step(s); the last command printed its output.")
        self.requests.append(f"step-{done + 1}")
        name, arguments = tool
        command = f"echo step-{done + 1}; {self.command}"
        return Reply(tool_calls=(ToolCall(name, {**arguments, _command_key(name): command}),))


def _shell_tool(tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """The agent's shell tool among the chat tools the proxy forwarded, with its fixed arguments."""
    names = {(t.get("function") or {}).get("name") for t in tools}
    if "exec_command" in names:
        return "exec_command", {}
    if "Bash" in names:
        return "Bash", {"description": "Run the task's command"}
    return None


def _command_key(tool: str) -> str:
    return "cmd" if tool == "exec_command" else "command"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _steps_done(messages: list[dict[str, Any]]) -> int:
    """The highest step the history mentions: in a call, its output, or a checkpoint."""
    found = 0
    for message in messages:
        text = _text(message.get("content"))
        for call in message.get("tool_calls") or []:
            text += " " + str((call.get("function") or {}).get("arguments", ""))
        found = max([found, *(int(n) for n in _STEP.findall(text))])
    return found


def _checkpoint(done: int) -> str:
    return "\n".join(
        [
            "## Completed work",
            f"- step-{done} done (steps 1..{done} ran the command)",
            "## Evidence",
            f"- the shell printed the output of step-{done}",
            "## Decisions",
            "- keep running the command once per step",
            "## Failed or abandoned directions",
            "- (none)",
            "## Explicit pending conditions",
            "- answer with one final line when all steps ran",
            "## Optional directions",
            "- (none)",
            "## Next step",
            "- run the step after the last one done, or answer if none is left",
        ]
    )


class NativeTaskModel:
    """The task model in the providers' own APIs: a script of each strict stand-in (``--native``)."""

    def __init__(self, steps: int, command: str) -> None:
        self.steps = steps
        self.command = command
        self.requests: list[str] = []

    def messages(self, body: dict[str, Any]) -> anthropic.MessageReply:
        """Anthropic Messages: think, then a ``Bash`` call per step, then the final line."""
        system = body.get("system")
        system_text = system if isinstance(system, str) else _text(system)
        done = _native_steps_done(body.get("messages") or [])
        if system_text.startswith(SUMMARY_MARKER):
            self.requests.append("checkpoint")
            return anthropic.MessageReply((anthropic.Text(_checkpoint(done)),))
        names = {tool.get("name") for tool in body.get("tools") or []}
        if "Bash" not in names or done >= self.steps:
            self.requests.append("final" if "Bash" in names else "side")
            final = f"{FINAL_PREFIX} ran {done} step(s); the last command printed its output."
            return anthropic.MessageReply((anthropic.Thinking(f"{done} step(s) ran; answer."), anthropic.Text(final)))
        self.requests.append(f"step-{done + 1}")
        call = {"command": f"echo step-{done + 1}; {self.command}", "description": "Run the task's command"}
        thought = anthropic.Thinking(f"Step {done + 1} of {self.steps}: run it.")
        return anthropic.MessageReply((thought, anthropic.ToolUse("Bash", call)))

    def responses(self, body: dict[str, Any]) -> responses.ResponseReply:
        """OpenAI Responses: reason, then an ``exec_command`` call per step, then the final line."""
        items = [item for item in body.get("input") or [] if isinstance(item, dict)]
        done = _native_steps_done(items)
        first = _text(items[0].get("content")) if items else ""
        if items and items[0].get("role") == "system" and first.startswith(SUMMARY_MARKER):
            self.requests.append("checkpoint")
            return responses.ResponseReply((responses.Message(_checkpoint(done)),))
        if items and LOCAL_COMPACTION_PROMPT in _text(items[-1].get("content")):
            self.requests.append("codex-local-summary")
            summary = f"Summary: steps 1..{done} of the task ran (step-{done} printed its output)."
            return responses.ResponseReply((responses.Message(summary),))
        names = {tool.get("name") for tool in body.get("tools") or []}
        if "exec_command" not in names or done >= self.steps:
            self.requests.append("final")
            final = f"{FINAL_PREFIX} ran {done} step(s); the last command printed its output."
            return responses.ResponseReply((responses.Reasoning((f"{done} step(s) ran.",)), responses.Message(final)))
        self.requests.append(f"step-{done + 1}")
        call = responses.FunctionCall("exec_command", {"cmd": f"echo step-{done + 1}; {self.command}"})
        return responses.ResponseReply((responses.Reasoning((f"Step {done + 1} of {self.steps}.",)), call))


def _native_steps_done(conversation: list[dict[str, Any]]) -> int:
    """The highest step the conversation mentions (calls, outputs, checkpoints), in either API's form."""
    return max((int(n) for n in _STEP.findall(json.dumps(conversation))), default=0)


def native_config(anthropic_url: str, responses_url: str, window: int) -> str:
    """The ``model_list`` YAML routing each agent model name natively to its stand-in."""
    entries = []
    for name in MODELS:
        if name.startswith("claude"):
            params = f"      model: anthropic/{name}\n      api_base: {anthropic_url}\n"
            params += f"      api_key: {anthropic.DEFAULT_API_KEY}\n"
            api = ""
        else:
            params = f"      model: openai/{name}\n      api_base: {responses_url}/v1\n"
            params += f"      api_key: {responses.DEFAULT_API_KEY}\n"
            api = "    api: responses\n"
        entries.append(
            f"  - model_name: {name}\n    litellm_params:\n{params}{api}"
            f"    model_info:\n      max_input_tokens: {window}\n      max_output_tokens: 4096\n"
        )
    return "model_list:\n" + "".join(entries)


def proxy_config(provider_url: str, window: int) -> str:
    """The ``model_list`` YAML routing every agent model name to the scripted provider."""
    entries = []
    for name in MODELS:
        entries.append(
            f"  - model_name: {name}\n"
            f"    litellm_params:\n"
            f"      model: openai/scripted-agent-model\n"
            f"      api_base: {provider_url}/v1\n"
            f"      api_key: sk-scripted-not-a-secret\n"
            f"    model_info:\n"
            f"      max_input_tokens: {window}\n"
            f"      max_output_tokens: 4096\n"
        )
    return "model_list:\n" + "".join(entries)


def _wait_ready(url: str, process: subprocess.Popen[bytes], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the proxy exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health/readiness", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    sys.exit("the proxy did not become ready")


def _provider_record(answers: list[str], stand_ins: list[Any]) -> dict[str, Any]:
    """What the provider side saw: the model's answers, and every model request that reached it (a strict
    stand-in's refusals are requests without an answer)."""
    if isinstance(stand_ins[0], ScriptedProvider):
        return {"answers": answers, "requests": len(stand_ins[0].history)}
    model_paths = ("/v1/messages", "/v1/responses")
    received = [r for stand_in in stand_ins for r in stand_in.requests if r.path in model_paths]
    return {
        "answers": answers,
        "requests": len(received),
        "refused": len(received) - len(answers),
        "native": [_native_summary(r) for r in received],
    }


def _native_summary(received: Any) -> dict[str, Any]:
    """The native fields of one request a stand-in received (what --native shows it got)."""
    body = received.body
    shown = {"path": received.path, "model": body.get("model")}
    for name in ("thinking", "reasoning", "include", "store", "output_config"):
        if name in body:
            shown[name] = body[name]
    if received.header("anthropic-beta"):
        shown["anthropic-beta"] = received.header("anthropic-beta")
    conversation = body.get("messages") or body.get("input") or []
    shown["thinking_blocks_sent"] = json.dumps(conversation).count('"type": "thinking"')
    shown["encrypted_reasoning_sent"] = json.dumps(conversation).count('"encrypted_content"')
    return shown


def main(argv: list[str] | None = None) -> int:
    """Start the scripted provider and the proxy; serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0, help="the proxy's port (default: a free one)")
    parser.add_argument("--steps", type=int, default=1, help="shell tool calls before the final answer")
    parser.add_argument("--command", default="echo hello", help="what each step runs after `echo step-N;`")
    parser.add_argument("--window", type=int, default=200_000, help="the routes' max_input_tokens")
    parser.add_argument("--context-window-tokens", type=int, help="SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS for the proxy")
    parser.add_argument("--prompt-percent", type=int, help="SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT for the proxy")
    parser.add_argument("--data-dir", type=Path, help="the proxy's store and traces (default: a temporary folder)")
    parser.add_argument("--native", action="store_true", help="native routes in front of the strict stand-ins")
    args = parser.parse_args(argv)

    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="scripted-proxy-"))
    port = args.port or free_port()
    with contextlib.ExitStack() as stack:
        if args.native:
            native = NativeTaskModel(args.steps, args.command)
            answers = native.requests
            stand_ins: list[Any] = [
                anthropic.ScriptedAnthropic(native.messages, accept_bearer=False),
                responses.ScriptedResponses(native.responses),
            ]
            urls = [stack.enter_context(serve_in_thread(stand_in.app())) for stand_in in stand_ins]
            config_text = native_config(urls[0], urls[1], args.window)
        else:
            model = AgentTaskModel(args.steps, args.command)
            answers = model.requests
            provider = ScriptedProvider(model)
            stand_ins = [provider]
            config_text = proxy_config(stack.enter_context(serve_in_thread(provider.app())), args.window)
        config = data_dir / "config.yaml"
        data_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(config_text)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SCIENCE_AGENT_", "CONTEXT_PROXY_"))}
        env |= {"SCIENCE_AGENT_DATA_DIR": str(data_dir / "store"), "SCIENCE_AGENT_CONTEXT_TRACE": "1"}
        if args.context_window_tokens:
            env["SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS"] = str(args.context_window_tokens)
        if args.prompt_percent:
            env["SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT"] = str(args.prompt_percent)
        argv_proxy = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)]
        log = (data_dir / "proxy.log").open("wb")
        process = subprocess.Popen(argv_proxy, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        stop = False

        def _stop(*_: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        try:
            _wait_ready(url, process)
            print(f"READY {url} {data_dir}", flush=True)
            while not stop and process.poll() is None:
                time.sleep(0.2)
        finally:
            process.terminate()
            process.wait(timeout=30)
            (data_dir / "provider.json").write_text(json.dumps(_provider_record(answers, stand_ins), indent=1) + "\n")
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
