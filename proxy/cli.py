"""``context-proxy serve | routes | sessions | keys | replay | report | demo | examples`` (also ``python -m proxy``)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from proxy.kernel.config import LOG_LEVELS, ConfigError, Settings
from proxy.process.exposure import check_exposure
from proxy.process.offline import prepare_offline_environment
from proxy.provider.local_model import LocalModelUnavailable
from proxy.session.store import StoreError


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``context-proxy`` command."""
    parser = argparse.ArgumentParser(prog="context-proxy", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the OpenAI-compatible proxy")
    serve.add_argument("--config", type=Path, help="litellm-proxy style YAML with a model_list")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=4000)
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback address without CONTEXT_PROXY_MASTER_KEY (something in front authenticates)",
    )
    serve.add_argument(
        "--record", type=Path, help="record sessions (requests, provider exchanges) here; or CONTEXT_PROXY_RECORD_DIR"
    )
    serve.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        help="default: CONTEXT_PROXY_LOG_LEVEL, else info (a line per request); warning and above log no requests",
    )
    routes = commands.add_parser("routes", help="list the configured routes and the API each provider is spoken to in")
    routes.add_argument("--config", type=Path, help="litellm-proxy style YAML with a model_list")
    sessions = commands.add_parser("sessions", help="list the stored sessions, or delete one")
    actions = sessions.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="each session's context id, scope, message count and last update")
    listing.add_argument("--config", type=Path, help="litellm-proxy style YAML with a model_list")
    deleting = actions.add_parser(
        "delete", help="delete a session from the store, with its trace folder and its recording folder"
    )
    deleting.add_argument("context_id", metavar="CONTEXT_ID", help="as `sessions list` prints it")
    deleting.add_argument("--config", type=Path, help="litellm-proxy style YAML with a model_list")
    key_commands = commands.add_parser("keys", help="create, list, rotate or revoke the teams' virtual keys")
    key_actions = key_commands.add_subparsers(dest="action", required=True)
    creating = key_actions.add_parser("create", help="make a key for a team and print it (shown once)")
    creating.add_argument("--team", required=True, help="the team the key's sessions belong to")
    creating.add_argument("--models", nargs="+", default=[], help="the model names it may use (default: all)")
    creating.add_argument("--max-requests-per-minute", type=int, help="requests per minute (default: no limit)")
    creating.add_argument("--max-tokens-per-minute", type=int, help="tokens sent per minute (default: no limit)")
    creating.add_argument("--expires", help="a duration (30d, 12h, 90m) or an ISO 8601 time (default: never)")
    creating.add_argument("--alias", help="a name for the key, usable instead of its id")
    key_actions.add_parser("list", help="every key's id, team, limits and state (never the key)")
    for verb, what in (("rotate", "print a new key for it; the old one stops"), ("revoke", "stop it")):
        acting = key_actions.add_parser(verb, help=f"name a key (id, alias, the key or its hash) and {what}")
        acting.add_argument("key", metavar="KEY")
    for action in key_actions.choices.values():
        action.add_argument("--config", type=Path, help="litellm-proxy style YAML with a model_list")
    replay = commands.add_parser("replay", help="replay recorded sessions through this build and configuration")
    replay.add_argument("folders", type=Path, nargs="+", help="record folders (one per replica)")
    replay.add_argument("--config", type=Path, help="the configuration to replay with (YAML with a model_list)")
    replay.add_argument("--out", type=Path, help="write the HTML verdict page here")
    replay.add_argument("--max-changed", type=int, help="exit non-zero when more than this many turns changed")
    demo = commands.add_parser("demo", help="run a scripted agent session through the real proxy, offline")
    demo.add_argument("--data-dir", type=Path, help="keep the store and traces here (default: a temporary folder)")
    demo.add_argument(
        "--local-model",
        action="store_true",
        help="against a real model: SmolLM2-135M on llama-cpp-python's server, started here (the dev extra)",
    )
    examples = commands.add_parser("examples", help="write three reproducible context examples, offline")
    examples.add_argument(
        "--out", type=Path, help="default: SCIENCE_AGENT_CONTEXT_EXAMPLE_DIR, else .tmp/context-examples"
    )
    report = commands.add_parser("report", help="write a self-contained HTML report of a trace folder")
    report.add_argument("--traces", type=Path, required=True, help="the trace folder (SCIENCE_AGENT_CONTEXT_TRACE_DIR)")
    report.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    report.add_argument("--team", help="only this team's sessions (`default`: the master key's)")
    args = parser.parse_args(argv)
    if args.command == "report":
        return _report(args.traces, args.out, args.team)
    prepare_offline_environment()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            settings = Settings.from_env(config_path=args.config)
            if args.record is not None:
                settings = dataclasses.replace(settings, record_dir=args.record)
            if args.log_level is not None:
                settings = dataclasses.replace(settings, log_level=args.log_level)
            logging.getLogger().setLevel(settings.log_level.upper())
            check_exposure(settings, args.host, args.allow_unauthenticated)
            return _serve(settings, args.host, args.port)
        if args.command == "routes":
            return _routes(Settings.from_env(config_path=args.config))
        if args.command == "sessions":
            from proxy.admin.sessions import delete_session, list_sessions

            settings = Settings.from_env(config_path=args.config)
            return list_sessions(settings) if args.action == "list" else delete_session(settings, args.context_id)
        if args.command == "keys":
            return _keys(args, Settings.from_env(config_path=args.config))
        if args.command == "replay":
            from proxy.replay.command import run_replay

            return run_replay(args.folders, Settings.from_env(config_path=args.config), args.out, args.max_changed)
        if args.command == "examples":
            from proxy.demo.examples import DEFAULT_DIR, run_examples

            return run_examples(args.out or Settings.from_env().example_dir or DEFAULT_DIR)
        if args.local_model:
            from proxy.demo.local_run import run_local_demo

            return run_local_demo(args.data_dir)
        from proxy.demo.run import run_demo

        return run_demo(args.data_dir)
    except (ConfigError, StoreError, LocalModelUnavailable) as exc:
        print(f"context-proxy: {exc}", file=sys.stderr)
        return 2


def _keys(args: argparse.Namespace, settings: Settings) -> int:
    from proxy.admin import keys

    if args.action == "create":
        return keys.create_key(
            settings,
            args.team,
            [m for given in args.models for m in given.split(",") if m],
            args.max_requests_per_minute,
            args.max_tokens_per_minute,
            args.expires,
            args.alias,
        )
    if args.action == "list":
        return keys.list_keys(settings)
    return (keys.rotate_key if args.action == "rotate" else keys.revoke_key)(settings, args.key)


def _routes(settings: Settings) -> int:
    """One line per route: the name clients ask for, litellm's model, the API it speaks and why."""
    if not settings.models:
        print("no model_list: every model name goes to litellm as is, speaking the API its provider defaults to")
        return 0
    for route in settings.models:
        print(f"{route.model_name}\t{route.litellm_model}\t{route.api}\t({route.api_reason})")
    return 0


def _report(traces: Path, out: Path, team: str | None = None) -> int:
    from proxy.report.build import write_report

    try:
        result = write_report(traces, out, team=team)
    except OSError as exc:
        print(f"context-proxy report: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {result.path}: {result.sessions} sessions, {result.files} model calls, "
        f"{result.bytes / 1_000_000:.1f} MB in {result.seconds:.1f} s",
        file=sys.stderr,
    )
    return 0


def _serve(settings: Settings, host: str, port: int) -> int:
    from proxy.app import create_app
    from proxy.builder import check_settings
    from proxy.process.drain import server_for

    check_settings(settings)
    app = create_app(settings)
    server_for(app, app.state.drain, host, port, log_level=settings.log_level).run()
    return 0
