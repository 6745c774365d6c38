"""Trace reading (Mooncake, sessions, Bailian), token synthesis and the theoretical hit rate."""

from __future__ import annotations

import orjson
import pytest

from dyn.core.bench.trace import (
    TokenSynth,
    TraceError,
    TraceRow,
    default_block_size,
    read_trace,
    theoretical_hit_rate,
)


def write(tmp_path, rows, name="trace.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    return path


def test_mooncake_rows_and_sessions(tmp_path):
    path = write(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
            {"timestamp": 5, "session_id": "a", "input_length": 600, "output_length": 5, "hash_ids": [1, 3]},
            {
                "session_id": "a",
                "delay": 250,
                "input_length": 1100,
                "output_length": 5,
                "hash_ids": [1, 3, 4],
            },
            {
                "session_id": "a",
                "delay_ms": 100.5,
                "input_length": 1200,
                "output_length": 5,
                "hash_ids": [1, 3, 4],
            },
        ],
    )
    rows = read_trace(path)
    assert rows[0] == TraceRow(input_length=1000, output_length=10, hash_ids=(1, 2), timestamp_ms=0.0)
    assert rows[1].timestamp_ms == 5.0 and rows[1].session_id == "a" and rows[1].delay_ms is None
    assert rows[2].timestamp_ms is None and rows[2].delay_ms == 250
    assert rows[3].delay_ms == 100.5
    assert default_block_size(rows, path) == 512
    assert len(read_trace(path, limit=2)) == 2


def test_bailian_rows_use_seconds_and_16_token_blocks(tmp_path):
    path = write(
        tmp_path,
        [
            {
                "chat_id": 7,
                "parent_chat_id": -1,
                "timestamp": 1.5,
                "input_length": 40,
                "output_length": 3,
                "hash_ids": [9, 10, 11],
                "turn": 1,
            }
        ],
    )
    rows = read_trace(path)
    assert rows[0].timestamp_ms == 1500.0 and rows[0].session_id is None
    assert default_block_size(rows, path) == 16


@pytest.mark.parametrize(
    "line, message",
    [
        (b"[1, 2]", "must be a JSON object"),
        (b'{"timestamp": 0, "output_length": 1}', "missing 'input_length'"),
        (
            b'{"timestamp": 0, "input_length": -1, "output_length": 1}',
            "'input_length' must be a non-negative integer",
        ),
        (
            b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": "x"}',
            "'hash_ids' must be a list",
        ),
        (b'{"input_length": 1, "output_length": 1}', "needs 'timestamp'"),
        (b'{"timestamp": 0, "input_length": 1', "not valid JSON"),
        (
            b'{"timestamp": 0, "input_length": 1000000000000, "output_length": 1}',
            "'input_length' is 1,000,000,000,000 tokens; at most 16,777,216",
        ),
        (
            b'{"timestamp": 0, "input_length": 1, "output_length": 16777217}',
            "'output_length' is 16,777,217 tokens; at most 16,777,216",
        ),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"timestamp": 0, "input_length": 1, "output_length": 1}\n' + line + b"\n")
    with pytest.raises(TraceError, match=message) as info:
        read_trace(path)
    assert f"{path}:2" in str(info.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(TraceError, match="no requests"):
        read_trace(tmp_path / "empty.jsonl")


def test_shared_hash_ids_give_shared_token_prefixes():
    synth = TokenSynth(block_size=4, vocab_size=1000, seed=3)
    a = synth.prompt(TraceRow(input_length=10, output_length=1, hash_ids=(1, 2, 3)), salt=0)
    b = synth.prompt(TraceRow(input_length=12, output_length=1, hash_ids=(1, 2, 5)), salt=1)
    c = synth.prompt(TraceRow(input_length=6, output_length=1, hash_ids=(7, 2)), salt=2)
    assert len(a) == 10 and len(b) == 12 and len(c) == 6
    assert a[:8] == b[:8] and a[8:10] != b[8:10]
    assert c[:4] != a[:4] and c[4:6] == a[4:6]  # the same id is the same block wherever it appears
    assert all(16 <= t < 1000 for t in a + b + c)
    assert (
        TokenSynth(4, 1000, seed=3).prompt(
            TraceRow(input_length=10, output_length=1, hash_ids=(1, 2, 3)), salt=0
        )
        == a
    )
    # more tokens than blocks: the tail is unique to the request
    long = synth.prompt(TraceRow(input_length=6, output_length=1, hash_ids=(1,)), salt=9)
    other = synth.prompt(TraceRow(input_length=6, output_length=1, hash_ids=(1,)), salt=10)
    assert long[:4] == other[:4] and long[4:] != other[4:]


def test_theoretical_hit_rate_counts_leading_blocks_seen_before():
    # [1,2,3]: 0 hits; [1,2,4]: 2 hits; [5,2]: 0 (2 after another parent is new); [1,2,3,6]: 3 hits
    assert theoretical_hit_rate([(1, 2, 3), (1, 2, 4), (5, 2), (1, 2, 3, 6)]) == pytest.approx(5 / 12)
    assert theoretical_hit_rate([]) == 0.0
