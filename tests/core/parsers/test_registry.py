"""Parser registries: names as vLLM and Dynamo spell them, every module found by itself (a lookup
imports only the module of its name; the names are read from the sources), a user's plugin file
registering its own parser, and clear errors."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.registry import UnknownParserError, load_plugin
from dyn.core.parsers.tool import TOOL_PARSERS

PLUGIN = Path(__file__).with_name("line_calls_plugin.py")
ISSUE_TOOL_PARSERS = (
    "hermes",
    "qwen3_coder",
    "llama3_json",
    "mistral",
    "pythonic",
    "granite",
    "internlm",
    "jamba",
    "deepseek_v3",
    "deepseek_v31",
    "glm45",
    "glm47",
    "kimi_k2",
    "gpt-oss",
)
ISSUE_REASONING_PARSERS = (
    "deepseek_r1",
    "qwen3",
    "glm45",
    "gpt_oss",
    "granite",
    "kimi",
    "minimax",
    "nemotron",
)


def test_every_promised_name_is_registered_and_spellings_agree():
    for name in ISSUE_TOOL_PARSERS:
        assert TOOL_PARSERS.get(name).name
    for name in ISSUE_REASONING_PARSERS:
        assert REASONING_PARSERS.get(name).name
    assert TOOL_PARSERS.get("gpt-oss") is TOOL_PARSERS.get("gpt_oss") is TOOL_PARSERS.get("openai")
    assert TOOL_PARSERS.get("Hermes") is TOOL_PARSERS.get("qwen25")


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownParserError) as info:
        TOOL_PARSERS.get("nope")
    assert "unknown tool-call parser 'nope'" in str(info.value) and "hermes" in str(info.value)


def test_a_plugin_file_registers_its_parser(parse):
    load_plugin(PLUGIN)
    load_plugin(PLUGIN)  # a second load is a no-op
    got = parse(TOOL_PARSERS.get("line_calls"), ['Sure.\nCALL f {"a": ', "1}"])
    assert got.content == "Sure.\n" and got.named_args == [("f", {"a": 1})]


def test_plugin_errors_say_what_went_wrong(tmp_path):
    with pytest.raises(ValueError, match="is not a file"):
        load_plugin(tmp_path / "absent.py")
    broken = tmp_path / "broken.py"
    broken.write_text("import nowhere_to_be_found\n")
    with pytest.raises(ValueError, match="failed to import: ModuleNotFoundError"):
        load_plugin(broken)


def test_a_vllm_plugin_is_refused_naming_dyns_parser_api(tmp_path):
    """Seed 004's plugin example imports vLLM's parser classes: where vLLM is not installed, the
    error says how to write the plugin for dyn instead of only "No module named 'vllm'"."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment")
    plugin = tmp_path / "example_tool_parser.py"
    plugin.write_text(
        "from vllm.tool_parsers import ToolParser, ToolParserManager\n\n\n"
        '@ToolParserManager.register_module(["example"])\n'
        "class ExampleToolParser(ToolParser):\n    pass\n"
    )
    with pytest.raises(ValueError) as refused:
        load_plugin(plugin)
    message = str(refused.value)
    assert "is written for vLLM" in message and "ToolParser subclass" in message
    assert "@TOOL_PARSERS.register" in message


# --- lazy lookups ------------------------------------------------------------------------------

_LOADED = """
import json, sys
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.tool import TOOL_PARSERS
out = {{}}
for registry, name in ((TOOL_PARSERS, {tool!r}), (REASONING_PARSERS, {reasoning!r})):
    before = sorted(m for m in sys.modules if m.startswith(registry.package + "."))
    registry.names()  # reads the sources only
    after_names = sorted(m for m in sys.modules if m.startswith(registry.package + "."))
    registry.get(name)
    parsers = set(registry.scan().modules.values())
    loaded = sorted(
        m.rsplit(".", 1)[1] for m in sys.modules
        if m.startswith(registry.package + ".") and m.rsplit(".", 1)[1] in parsers
    )
    out[registry.package] = {{"before": before, "after_names": after_names, "loaded": loaded}}
print(json.dumps(out))
"""


def _run(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_lookup_imports_only_the_module_that_registers_the_name():
    got = _run(_LOADED.format(tool="hermes", reasoning="qwen3"))
    tool, reasoning = got["dyn.core.parsers.tool"], got["dyn.core.parsers.reasoning"]
    # names() reads the sources: no parser module is imported to list them
    assert tool["before"] == tool["after_names"] == []
    assert reasoning["before"] == reasoning["after_names"] == []
    assert tool["loaded"] == ["hermes"]
    assert reasoning["loaded"] == ["think"]
    got = _run(_LOADED.format(tool="Qwen25", reasoning="kimi-k2"))  # an alias, another spelling
    assert got["dyn.core.parsers.tool"]["loaded"] == ["hermes"]
    assert got["dyn.core.parsers.reasoning"]["loaded"] == ["kimi", "think"]  # kimi's base is think's


_EVERYTHING = """
import importlib, json, pkgutil
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.tool import TOOL_PARSERS
out = {}
for registry in (TOOL_PARSERS, REASONING_PARSERS):
    scanned = registry.names()
    package = importlib.import_module(registry.package)
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(registry.package + "." + module.name)
    registered = {name: registry.get(name).__module__ for name in sorted(registry._classes)}
    out[registry.package] = {
        "scanned": scanned,
        "registered": sorted(registered),
        "by_module": {name: module.rsplit(".", 1)[1] for name, module in registered.items()},
        "scan": registry.scan().modules,
    }
print(json.dumps(out))
"""


def test_names_are_what_importing_every_module_registers():
    for package, got in _run(_EVERYTHING).items():
        assert got["scanned"] == got["registered"], package
        # and the scan names the module each class is registered from
        assert got["scan"] == got["by_module"], package


def _package(tmp_path, monkeypatch, files: dict[str, str]) -> str:
    name = f"regpkg_{uuid.uuid4().hex}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text(
        "from dyn.core.parsers.registry import Registry\nREG = Registry('widget parser', __name__)\n"
    )
    for module, text in files.items():
        (root / f"{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


_CLASS = """
class {cls}:
    @classmethod
    def check(cls):
        pass
"""


def test_lazy_registry_over_a_package(tmp_path, monkeypatch):
    name = _package(
        tmp_path,
        monkeypatch,
        {
            "alpha": "from . import REG\n\n@REG.register(\n    'alpha',\n    \"Alpha-Two\",  \n)"
            + _CLASS.format(cls="A"),
            # names the scan cannot read: imported only when a name is not found otherwise
            "beta": "from . import REG\nNAMES = ('beta',)"
            + _CLASS.format(cls="B")
            + "REG.register(*NAMES)(B)\n",
            "broken": "from . import REG\nraise RuntimeError('broken on import')\n\n@REG.register('delta')"
            + _CLASS.format(cls="D"),
            "helper": "raise RuntimeError('a helper without parsers is never imported by the registry')\n",
            "_hidden": "from . import REG\n\n@REG.register('hidden')" + _CLASS.format(cls="H"),
        },
    )
    registry = importlib.import_module(name).REG
    assert registry.scan().modules == {"alpha": "alpha", "alpha_two": "alpha", "delta": "broken"}
    assert registry.scan().opaque == ("beta",)
    assert registry.get("ALPHA-two") is registry.get("alpha") and registry.get("alpha").name == "alpha"
    assert f"{name}.alpha" in sys.modules and f"{name}.beta" not in sys.modules
    assert registry.get("beta").name == "beta"  # found by importing what the scan could not read
    with pytest.raises(RuntimeError, match="broken on import"):
        registry.get("delta")
    with pytest.raises(UnknownParserError) as info:
        registry.get("hidden")
    assert str(info.value) == "unknown widget parser 'hidden'; known: alpha, alpha_two, beta, delta"
    assert f"{name}.helper" not in sys.modules and f"{name}._hidden" not in sys.modules


def test_a_name_registered_before_its_module_is_imported_is_the_module_s(tmp_path, monkeypatch):
    # as when every module was imported at the first lookup: a plugin loaded first that takes a
    # built-in name gives way to the built-in parser
    name = _package(
        tmp_path,
        monkeypatch,
        {"alpha": "from . import REG\n\n@REG.register('alpha')" + _CLASS.format(cls="A")},
    )
    registry = importlib.import_module(name).REG

    @registry.register("alpha", "gamma")
    class Plugin:
        @classmethod
        def check(cls) -> None:
            pass

    assert registry.get("gamma") is Plugin
    assert registry.get("alpha").__module__ == f"{name}.alpha"
    assert registry.names() == ["alpha", "gamma"]
