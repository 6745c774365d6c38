"""``--priority-convention`` end to end: two kinds of request contend for one vLLM-flavoured mocker
worker (``--scheduling-policy priority``, one sequence at a time, so the engine's queue decides
who runs next), and which gets its first token first shows how the frontend read the priority.

- ``dyn`` (the default, and Dynamo >= 1.1: ai-dynamo/dynamo#7492): larger ``agent_hints.priority``
  is more important, so priority 10 runs before priority 1 (the frontend negates it for vLLM).
- ``dynamo`` (Dynamo 1.0 + vLLM: ai-dynamo/dynamo#6348, "vLLM natively treats smaller values as
  higher priority"): the value reaches vLLM as sent, so priority 1 runs before priority 10.
"""

from __future__ import annotations

import openai
import pytest

from tests.integration.conftest import first_tokens_behind_a_blocker

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"


@pytest.mark.parametrize(("convention", "first"), [("dyn", "ten"), ("dynamo", "one")])
def test_which_priority_is_served_first_follows_the_convention(stack_factory, convention, first):
    s = stack_factory(f"conv-{convention}")
    s.start(
        "worker",
        "mocker",
        "--namespace",
        s.namespace,
        "--max-num-seqs",
        "1",
        "--speedup-ratio",
        "1",
        "--scheduling-policy",
        "priority",
    )
    s.start_frontend("--priority-convention", convention)
    s.wait_instances(1)
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=60)
    first_token = first_tokens_behind_a_blocker(client, MODEL, (("one", 1), ("ten", 10)))
    second = "one" if first == "ten" else "ten"
    winners = [first_token[f"{first}{i}"] for i in range(3)]
    losers = [first_token[f"{second}{i}"] for i in range(3)]
    assert max(winners) < min(losers), (convention, winners, losers)
    s.close()


def test_an_unknown_convention_is_refused_at_start(stack_factory):
    s = stack_factory("conv-bad")
    proc = s.start(
        "frontend", "--http-port", "0", "--namespace", s.namespace, "--priority-convention", "sglang"
    )
    assert proc.proc.wait(30) == 2
    assert "--priority-convention must be one of dyn, dynamo" in proc.log()


def test_dyn_serve_passes_the_convention_to_its_frontend_only(monkeypatch):
    from typer.testing import CliRunner

    from dyn.cli.app import app

    configs: list = []
    monkeypatch.setattr("dyn.core.serve.run_stack", lambda config, **_kw: configs.append(config) or 0)
    result = CliRunner().invoke(app, ["serve", "--workers", "1", "--priority-convention", "dynamo"])
    assert result.exit_code == 0, result.output
    (config,) = configs
    frontend = list(config.frontend.argv)
    assert frontend[frontend.index("--priority-convention") + 1] == "dynamo"
    assert "--priority-convention" not in config.workers[0].argv
