"""``--workers`` parsing, and ``dyn indexer`` refusing bad flags with exit status 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dyn.cli.app import app
from dyn.core.indexer.workers import StaticWorker, parse_workers


def test_parse_workers_reads_ids_ranks_and_replay_endpoints():
    assert parse_workers("7=tcp://127.0.0.1:5557, 8:1=tcp://h:1|tcp://h:2,") == [
        StaticWorker(7, 0, "tcp://127.0.0.1:5557", None),
        StaticWorker(8, 1, "tcp://h:1", "tcp://h:2"),
    ]


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "empty"),
        ("tcp://h:1", "is not ID[:DP_RANK]="),
        ("x=tcp://h:1", "is not ID[:DP_RANK]="),
        ("-1=tcp://h:1", "is not ID[:DP_RANK]="),
        ("1:a=tcp://h:1", "is not ID[:DP_RANK]="),
        ("1=h:1", "not a ZMQ address"),
        ("1=tcp://h:1|h:2", "replay endpoint"),
        ("1=tcp://", "not a ZMQ address"),
        ("1=tcp://h:1,1:0=tcp://h:2", "twice"),
        ("18446744073709551616=tcp://h:1", "2**64"),
    ],
)
def test_parse_workers_says_what_is_wrong(text, complaint):
    with pytest.raises(ValueError, match="--workers") as caught:
        parse_workers(text)
    assert complaint in str(caught.value)


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--workers", "nonsense", "--block-size", "16"], "ID[:DP_RANK]="),
        (["--workers", "1=tcp://127.0.0.1:1"], "--block-size"),
        (["--block-size", "0"], "--block-size"),
        (["--router-event-threads", "0"], "--router-event-threads"),
    ],
)
def test_bad_flags_exit_2_with_a_message(argv, complaint):
    result = CliRunner().invoke(app, ["indexer", *argv], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert complaint in result.output
