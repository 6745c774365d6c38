"""--replies and --tool-call-rate on the command line: one flag table for `dyn worker mocker` and
`dyn bench replay --offline` (and so for `dyn serve`, which forwards them), with env twins and a
one-line error before anything starts."""

import json

import pytest
import typer.main
from typer.testing import CliRunner

from dyn.cli.app import app

runner = CliRunner()


@pytest.mark.parametrize("command", [["worker", "mocker"], ["bench", "replay"]])
def test_both_commands_take_the_flags(command):
    cmd = typer.main.get_command(app)
    for name in command:
        cmd = cmd.commands[name]
    options = {o for p in cmd.params for o in p.opts}
    assert {"--replies", "--tool-call-rate"} <= options


def test_a_bad_replies_file_stops_the_worker_with_the_line(tmp_path):
    path = tmp_path / "replies.jsonl"
    path.write_text(json.dumps({"match": "ok", "text": "fine"}) + "\n" + '{"match": "(", "text": "x"}\n')
    result = runner.invoke(
        app, ["worker", "mocker", "--discovery-dir", str(tmp_path), "--replies", str(path)]
    )
    assert result.exit_code == 2 and "line 2: bad regex" in result.output
    result = runner.invoke(
        app,
        ["worker", "mocker", "--discovery-dir", str(tmp_path)],
        env={"DYN_REPLIES": str(tmp_path / "absent.jsonl")},
    )
    assert result.exit_code == 2 and "no such file" in result.output


def test_a_rate_outside_zero_to_one_is_refused():
    result = runner.invoke(app, ["worker", "mocker"], env={"DYN_TOOL_CALL_RATE": "1.5"})
    assert result.exit_code == 2 and "--tool-call-rate must be a probability between 0 and 1" in result.output
