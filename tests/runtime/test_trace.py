"""``TraceWriter``: a trace that cannot be written is counted and logged, never raised, and leaves no file."""

from __future__ import annotations

import json

from proxy.runtime.trace import TraceWriter


def test_a_written_trace_is_private_json(tmp_path):
    writer = TraceWriter(tmp_path / "traces")
    path = writer.write("ctx", 1, {"turn": 1})
    assert path is not None and json.loads(path.read_text())["turn"] == 1
    assert path.stat().st_mode & 0o777 == 0o600
    assert writer.failures == 0


def test_a_value_that_cannot_be_encoded_is_counted_and_leaves_nothing(tmp_path, caplog):
    writer = TraceWriter(tmp_path / "traces")
    assert writer.write("ctx", 1, {"text": "\ud800"}) is None
    assert writer.failures == 1
    assert not list((tmp_path / "traces").rglob("*"))
    assert "not written" in caplog.text


def test_a_trace_folder_that_is_a_file_is_counted(tmp_path):
    (tmp_path / "traces").write_text("in the way")
    writer = TraceWriter(tmp_path / "traces")
    assert writer.write("ctx", 1, {"turn": 1}) is None
    assert writer.write("ctx", 2, {"turn": 2}) is None
    assert writer.failures == 2
