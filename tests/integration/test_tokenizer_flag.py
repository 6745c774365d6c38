"""vLLM's ``--tokenizer``: a model whose tokenizer files are in another directory, served by real
processes with the official ``openai`` client.

The model directory holds only config.json and generation_config.json (dyn-tiny's); the
tokenizer's holds dyn-tiny's tokenizer files. Without ``--tokenizer`` neither the frontend nor the
worker can load it. ``dyn serve --tokenizer`` hands the flag to both; a worker started with it
publishes the tokenizer's directory in discovery, so a frontend that has never seen the model
loads it from there.
"""

from __future__ import annotations

import shutil

import openai
import pytest

from dyn.core.model import TINY_MODEL_DIR
from tests.integration.conftest import serve_ready_url

pytestmark = pytest.mark.integration


@pytest.fixture
def split_model(tmp_path):
    model, tok = tmp_path / "weights", tmp_path / "tok"
    model.mkdir()
    tok.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(TINY_MODEL_DIR / name, model / name)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(TINY_MODEL_DIR / name, tok / name)
    return model, tok


def chat(url: str, model: str) -> str:
    c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
    got = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    assert got.usage.prompt_tokens > 0
    return got.choices[0].message.content


def test_dyn_serve_hands_tokenizer_to_frontend_and_workers(dyn_process, split_model):
    model, tok = split_model
    without = dyn_process("serve", "--http-port", "0", "--model-path", str(model), "--workers", "1")
    assert without.proc.wait(60) != 0
    assert "no tokenizer.json" in without.log()
    proc = dyn_process(
        "serve", "--http-port", "0", "--model-path", str(model), "--tokenizer", str(tok),
        "--workers", "1", "--speedup-ratio", "100",
    )  # fmt: skip
    assert chat(serve_ready_url(proc), "weights")


def test_a_frontend_loads_a_discovered_models_tokenizer_from_where_its_worker_read_it(
    stack_factory, split_model
):
    model, tok = split_model
    stack = stack_factory("tok")
    stack.worker("--model-path", str(model), "--tokenizer", str(tok))
    stack.start_frontend()  # serves dyn-tiny itself, and what workers register
    stack.wait_instances(1)
    assert chat(stack.url + "/v1", "weights")
