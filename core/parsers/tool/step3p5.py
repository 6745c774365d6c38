"""StepFun Step-3.5 / Step-3.7 tool calls (vLLM's ``step3p5``): exactly the Qwen3-Coder XML
grammar (stepfun-ai/Step-3.5-Flash's chat template; vLLM's parser/step3p5.py configures its
Qwen3 parser unchanged for tool calls):

    Sure! Let me check the weather for you.<tool_call>
    <function=get_current_weather>
    <parameter=city>
    Dallas
    </parameter>
    </function>
    </tool_call>

so the calls are read, typed and written as ``qwen3_coder`` does. (Step-3's older format, with
``<｜tool_call_begin｜>`` and ``steptml`` tags, is the ``step3`` parser.)
"""

from __future__ import annotations

from dyn.core.parsers.tool import TOOL_PARSERS
from dyn.core.parsers.tool.qwen3_coder import Qwen3CoderToolParser


@TOOL_PARSERS.register("step3p5")
class Step3p5ToolParser(Qwen3CoderToolParser):
    needs_special_tokens = True  # vLLM's adjust_request (its parser engine keeps special tokens)
