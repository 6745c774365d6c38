"""``plugins.vllm.disagg`` and ``VllmEngine``'s P/D request path against a stand-in ``AsyncLLM``.

The parameter shapes are vLLM 0.32's: the prefill side's ``{"do_remote_decode": true}`` and a
NIXL decode descriptor as ``NixlConnector``'s scheduler returns it from ``request_finished``
(``vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py``), carried to the decode
request in ``SamplingParams.extra_args["kv_transfer_params"]`` as vLLM's serving layer does.
The real engines run in ``test_real_vllm_disagg.py``.
"""

from __future__ import annotations

import json

import pytest

from dyn.core.engine import EngineError
from dyn.core.messages import Finish, GenerateRequest, KvTransfer, StopConditions
from dyn.plugins.vllm import disagg
from dyn.plugins.vllm.config import VllmConfig
from tests.plugins.vllm.test_engine_requests import FakeLLM, collect, delta, engine

pytestmark = pytest.mark.anyio
NIXL_PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2, 3]],
    "remote_engine_id": "e1",
    "remote_host": "127.0.0.1",
    "remote_port": 5601,
    "remote_num_tokens": 70,
}


@pytest.mark.parametrize(
    ("args", "given"),
    [
        ([], False),
        (["--swap-space", "4"], False),
        (["--kv-transfer-config", "{}"], True),
        (["--kv-transfer-config={}"], True),
        (["--kv_transfer_config", "{}"], True),
        (["--kv-transfer-config.kv_connector", "NixlConnector"], True),
    ],
)
def test_a_users_kv_transfer_config_is_found_in_any_of_vllms_spellings(args, given):
    assert disagg.user_kv_transfer_config(args) is given


def test_the_connector_configs_vllm_reads():
    nixl = json.loads(disagg.kv_transfer_config("nixl", "cpu", "/unused"))
    assert nixl == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_buffer_device": "cpu",
    }
    assert "kv_buffer_device" not in json.loads(disagg.kv_transfer_config("nixl", "cuda", "/unused"))
    storage = json.loads(disagg.kv_transfer_config("storage", "cpu", "/shared/kv"))
    assert storage["kv_connector"] == "DynStorageConnector"
    assert storage["kv_connector_module_path"] == "dyn.plugins.vllm.kv_connector"
    assert storage["kv_connector_extra_config"] == {"shared_storage_path": "/shared/kv"}
    assert disagg.default_connector("cpu") == "storage" and disagg.default_connector("cuda") == "nixl"
    with pytest.raises(ValueError, match="--kv-connector"):
        disagg.kv_transfer_config("lmcache", "cpu", "/x")


def test_the_default_storage_path_is_per_namespace(tmp_path):
    assert disagg.default_storage_path("ns1", str(tmp_path)) == str(tmp_path / "ns1" / "kv-transfer")
    assert disagg.default_storage_path("ns1", None, "etcd").endswith("dyn-kv-ns1")


def test_a_bad_kv_connector_is_refused_before_vllm_starts():
    with pytest.raises(ValueError, match="--kv-connector must be nixl or storage"):
        VllmConfig(kv_connector="p2p").validate()


def test_side_channel_ports_are_picked_unless_the_environment_sets_one():
    env = disagg.side_channel_env("127.0.0.1", {})
    assert env[disagg.SIDE_CHANNEL_HOST] == "127.0.0.1" and int(env[disagg.SIDE_CHANNEL_PORT]) > 0
    assert disagg.side_channel_env("127.0.0.1", {disagg.SIDE_CHANNEL_PORT: "7000"}).keys() == {
        disagg.SIDE_CHANNEL_HOST
    }


def finished(tokens, reason, kv_transfer_params=None):
    out = delta(tokens, reason)
    out.kv_transfer_params = kv_transfer_params
    return out


def pd_engine(llm: FakeLLM, *, connector: bool = True):
    e = engine(llm)
    e._kv_connector = connector
    llm.release.set()
    return e


async def test_a_prefill_request_asks_vllm_to_keep_the_kv_and_answers_with_its_descriptor():
    llm = FakeLLM([finished([9], "length", NIXL_PARAMS)])
    request = GenerateRequest(
        "p", list(range(70)), stop=StopConditions(max_tokens=1), kv_transfer=KvTransfer(phase="prefill")
    )
    outs = await collect(pd_engine(llm), request)
    assert llm.calls[0]["params"]["extra_args"] == {"kv_transfer_params": {"do_remote_decode": True}}
    assert llm.calls[0]["params"]["max_tokens"] == 1
    finish = outs[-1]
    assert isinstance(finish, Finish)
    # the host fills in its instance id (source_instance_id 0 here)
    assert finish.kv_transfer == KvTransfer(phase="decode", prompt_tokens=70, params=json.dumps(NIXL_PARAMS))


async def test_a_decode_request_hands_the_descriptor_back_to_vllm():
    llm = FakeLLM([delta([4, 5]), finished([6], "length")])
    transfer = KvTransfer(
        phase="decode", source_instance_id=7, prompt_tokens=70, params=json.dumps(NIXL_PARAMS)
    )
    outs = await collect(pd_engine(llm), GenerateRequest("d", list(range(70)), kv_transfer=transfer))
    assert llm.calls[0]["params"]["extra_args"] == {"kv_transfer_params": NIXL_PARAMS}
    assert outs[-1].kv_transfer is None and outs[-1].usage.completion_tokens == 3


async def test_without_a_connector_a_prefill_keeps_nothing_and_a_decode_prefills_locally():
    llm = FakeLLM([finished([9], "length")])
    outs = await collect(
        pd_engine(llm, connector=False), GenerateRequest("p", [1, 2], kv_transfer=KvTransfer(phase="prefill"))
    )
    assert "extra_args" not in llm.calls[0]["params"]
    assert outs[-1].kv_transfer == KvTransfer(phase="decode")
    llm = FakeLLM([finished([9], "length")])
    transfer = KvTransfer(phase="decode", params=json.dumps(NIXL_PARAMS))
    await collect(pd_engine(llm, connector=False), GenerateRequest("d", [1, 2], kv_transfer=transfer))
    assert "extra_args" not in llm.calls[0]["params"]


async def test_an_aggregated_request_carries_no_kv_transfer_params():
    llm = FakeLLM([finished([9], "length")])
    outs = await collect(pd_engine(llm), GenerateRequest("a", [1, 2]))
    assert "extra_args" not in llm.calls[0]["params"] and outs[-1].kv_transfer is None


@pytest.mark.parametrize("params", ["{broken", "[1, 2]"])
async def test_decode_params_that_are_not_a_json_object_are_a_bad_request(params):
    llm = FakeLLM([finished([9], "length")])
    transfer = KvTransfer(phase="decode", params=params)
    with pytest.raises(EngineError) as refused:
        await collect(pd_engine(llm), GenerateRequest("d", [1, 2], kv_transfer=transfer))
    assert refused.value.code == "bad_request" and "kv_transfer.params" in str(refused.value)
    assert llm.calls == []


async def test_a_decode_worker_reading_another_storage_directory_says_so_once(caplog):
    stored = {disagg.STORAGE_KEY: "/elsewhere", "prompt_tokens": 70}
    e = pd_engine(FakeLLM([finished([9], "length")]))
    e._kv_storage = "/here"
    transfer = KvTransfer(phase="decode", params=json.dumps(stored))
    with caplog.at_level("WARNING", logger="dyn.plugins.vllm.engine"):
        for rid in ("d1", "d2"):
            e._llm = FakeLLM([finished([9], "length")])
            e._llm.release.set()
            await collect(e, GenerateRequest(rid, [1, 2], kv_transfer=transfer))
    warnings = [r.getMessage() for r in caplog.records if "/elsewhere" in r.getMessage()]
    assert len(warnings) == 1 and "--kv-storage-path" in warnings[0]


def test_the_store_keeps_the_newest_prompts_only(tmp_path):
    import os

    from dyn.plugins.vllm.disagg import prune

    for i in range(6):
        (tmp_path / f"prompt{i}").mkdir()
        (tmp_path / f"prompt{i}" / "layer.safetensors").write_bytes(b"kv")
        os.utime(tmp_path / f"prompt{i}", (1000 + i, 1000 + i))
    (tmp_path / "not-a-prompt").write_text("files are left alone")
    assert prune(str(tmp_path), keep=4) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "not-a-prompt",
        "prompt2",
        "prompt3",
        "prompt4",
        "prompt5",
    ]
    assert prune(str(tmp_path), keep=4) == 0
    assert prune(str(tmp_path / "missing"), keep=4) == 0
