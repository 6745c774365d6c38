"""``dyn bench`` flags: dry runs, the choice of workload, and usage errors as one sentence."""

from __future__ import annotations

from typer.testing import CliRunner

from dyn.cli.app import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, ["bench", *args], env={"COLUMNS": "200"})


def test_dry_run_prints_the_shape_and_theoretical_hit_rate_without_a_server():
    result = invoke(
        "--parallel-sampling",
        "--problems",
        "2",
        "--samples",
        "3",
        "--system-tokens",
        "64",
        "--problem-tokens",
        "64",
        "--block-size",
        "16",
        "--dry-run",
    )
    assert result.exit_code == 0, result.output
    # 6 prompts of 8 blocks = 48; misses: 4 system blocks once + 4 blocks of each of 2 problems = 12
    assert "requests" in result.output and "75.0%" in result.output


def test_dry_run_of_a_trace(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1000, "input_length": 1024, "output_length": 8, "hash_ids": [1, 3]}\n'
    )
    result = invoke("--trace", str(trace), "--dry-run", "--speedup", "2")
    assert result.exit_code == 0, result.output
    assert "25.0%" in result.output and "0.50" in result.output  # span 1 s / speedup 2


def test_dry_run_of_multi_turn_shows_the_tools_only_when_offered():
    args = ("--multi-turn", "--agents", "2", "--lead-turns", "2", "--subagents", "1", "--dry-run")
    result = invoke(*args, "--tools", "3", "--max-tool-rounds", "2", "--tool-result-tokens", "32")
    assert result.exit_code == 0, result.output
    rows = {
        tuple(cell.strip() for cell in line.strip("│ ").split("│")) for line in result.output.splitlines()
    }
    assert {("tools", "3"), ("max tool rounds", "2"), ("tool result tokens", "32")} <= rows
    plain = invoke(*args)
    assert plain.exit_code == 0 and "tools" not in plain.output


def test_exactly_one_workload():
    for args in ([], ["--prefix", "--multi-turn"]):
        result = invoke(*args, "--dry-run")
        assert result.exit_code == 2 and "choose exactly one workload" in result.output


def test_usage_errors_are_one_sentence(tmp_path):
    cases = [
        (["--prefix"], "--url is required"),
        (["--prefix", "--dry-run", "--concurrency", "2", "--request-rate", "1"], "not both"),
        (["--multi-turn", "--dry-run", "--lead-turns", "2", "--subagents", "2"], "--subagents must be"),
        (["--prefix", "--dry-run", "--tools", "2"], "--tools needs --multi-turn"),
        (["--multi-turn", "--dry-run", "--tools", "1000"], "--tools must be between 0 and"),
        (["--trace", str(tmp_path / "none.jsonl"), "--dry-run"], "cannot read trace"),
        (["--prefix", "--dry-run", "--duration", "0"], "--duration must be positive"),
        (["--prefix", "--dry-run", "--request-rate", "nan"], "--request-rate must be a positive number"),
        (["--prefix", "--url", "127.0.0.1:8000"], "must start with http://"),
        (
            ["--prefix", "--url", "http://127.0.0.1:9", "-o", str(tmp_path / "no" / "r.json")],
            "cannot write into",
        ),
    ]
    for args, message in cases:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output


def test_compare_refuses_files_that_are_not_results(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = runner.invoke(app, ["bench", "compare", str(bad), str(bad)])
    assert result.exit_code == 2 and "not a dyn bench result" in result.output
