"""``--served-model-name a b`` as vLLM's argparse (``nargs='+'``) takes it, on a real command line."""

from __future__ import annotations

import subprocess
import sys

from dyn.cli.options import expand_multi_value


def test_values_after_a_multi_value_flag_become_repeated_flags():
    args = ["frontend", "--served-model-name", "a", "b", "--http-port", "0", "--served-model-name", "c"]
    assert expand_multi_value(args) == [
        "frontend",
        "--served-model-name",
        "a",
        "--served-model-name",
        "b",
        "--http-port",
        "0",
        "--served-model-name",
        "c",
    ]


def test_other_flags_equals_forms_and_everything_after_a_double_dash_stay_as_they_are():
    args = [
        "worker",
        "vllm",
        "--model-path",
        "m",
        "x",
        "--served-model-name=a",
        "b",
        "--",
        "--served-model-name",
        "c",
        "d",
    ]
    assert expand_multi_value(args) == args


def test_a_worker_takes_several_names_on_its_command_line(tmp_path):
    """``dyn worker mocker --served-model-name a b`` registers model ``a`` with alias ``b``."""
    env_dir = tmp_path / "discovery"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dyn.cli",
            "worker",
            "mocker",
            "--served-model-name",
            "a",
            "b",
            "--model-name",
            "z",
            "--discovery-dir",
            str(env_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--model-name 'z' and --served-model-name 'a' disagree" in proc.stderr
