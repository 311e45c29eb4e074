"""``context-proxy serve`` refuses bad settings before serving, naming the setting, with exit code 2."""

from __future__ import annotations

import pytest

from proxy.cli import main


@pytest.mark.parametrize(
    ("config", "env", "named"),
    [
        ("contributors:\n  governance: {polcy: strict}\n", {}, "contributors.governance.polcy: Extra inputs"),
        ("contributors:\n  nobody: {x: 1}\n", {}, "contributors.nobody names no installed contributor"),
        ("", {"CONTEXT_PROXY_STORE_URL": "postgresql://u@127.0.0.1/test?pool_size=abc"}, "pool_size='abc'"),
        ("", {"SCIENCE_AGENT_CONTEXT_TARGET_PERCENT": "90"}, "FORCED_PERCENT < SCIENCE_AGENT_CONTEXT_TARGET_PERCENT"),
        ("", {"CONTEXT_PROXY_LOG_LEVEL": "loud"}, "CONTEXT_PROXY_LOG_LEVEL='loud' is not one of debug, info"),
        (
            "model_list:\n  - {model_name: a, litellm_params: {model: x}}\n",
            {"SCIENCE_AGENT_SUMMARY_MODEL": "b"},
            "SCIENCE_AGENT_SUMMARY_MODEL='b'",
        ),
    ],
)
def test_serve_stops_on_bad_settings(tmp_path, monkeypatch, capsys, config, env, named):
    path = tmp_path / "config.yaml"
    path.write_text(config or "model_list: []\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--config", str(path)]) == 2
    assert named in capsys.readouterr().err
