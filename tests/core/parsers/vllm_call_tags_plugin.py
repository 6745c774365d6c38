"""A user's tool-call parser written for vLLM 0.32 (the tests load it with ``--tool-parser-plugin``
where vLLM is installed): calls are ``<call>{"name": ..., "arguments": {...}}</call>``, text before
the first call is content. Written in vLLM's idiom, as its Hermes parser is: each delta re-reads
``current_text`` and sends what was not sent yet. Closing braces at the end of the arguments wait
for ``</call>`` (which of them close the arguments is known only then), so a call whose end marker
never comes leaves arguments that vLLM's serving sends at the end from ``prev_tool_call_arr``."""

import json
import re
from collections.abc import Sequence

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers import ToolParser, ToolParserManager
from vllm.tool_parsers.utils import partial_tag_overlap

START, END = "<call>", "</call>"
NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
ARGUMENTS = re.compile(r'"arguments"\s*:\s*')


@ToolParserManager.register_module(["call_tags", "call-tags-too"])
class CallTagsToolParser(ToolParser):
    def __init__(self, tokenizer, tools=None):
        super().__init__(tokenizer, tools)
        self.sent_content = 0

    def adjust_request(self, request: ChatCompletionRequest) -> ChatCompletionRequest:
        request = super().adjust_request(request)
        if request.tools and request.tool_choice != "none":
            request.skip_special_tokens = False
        return request

    def extract_tool_calls(
        self, model_output: str, request: ChatCompletionRequest
    ) -> ExtractedToolCallInformation:
        bodies = re.findall(re.escape(START) + "(.*?)" + re.escape(END), model_output, re.DOTALL)
        if not bodies:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        calls = []
        for body in bodies:
            call = json.loads(body)
            arguments = json.dumps(call["arguments"], ensure_ascii=False)
            calls.append(ToolCall(function=FunctionCall(name=call["name"], arguments=arguments)))
        content = model_output[: model_output.index(START)]
        return ExtractedToolCallInformation(tools_called=True, tool_calls=calls, content=content or None)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        start = current_text.find(START)
        sendable = start if start >= 0 else len(current_text) - partial_tag_overlap(current_text, START)
        content = None
        if sendable > self.sent_content:
            content = current_text[self.sent_content : sendable]
            self.sent_content = sendable
        deltas = []
        for index, (body, closed) in enumerate(self._bodies(current_text)):
            if index == len(self.prev_tool_call_arr):
                name = NAME.search(body)
                if name is None:
                    break
                self.prev_tool_call_arr.append({"name": name.group(1)})
                self.streamed_args_for_tool.append("")
                deltas.append(
                    DeltaToolCall(
                        index=index,
                        type="function",
                        id=make_tool_call_id(),
                        function=DeltaFunctionCall(name=name.group(1)).model_dump(exclude_none=True),
                    )
                )
            arguments = self._arguments(index, body, closed)
            sent = self.streamed_args_for_tool[index]
            if arguments is not None and len(arguments) > len(sent):
                self.streamed_args_for_tool[index] = arguments
                deltas.append(
                    DeltaToolCall(
                        index=index,
                        function=DeltaFunctionCall(arguments=arguments[len(sent) :]).model_dump(
                            exclude_none=True
                        ),
                    )
                )
        if content or deltas:
            return DeltaMessage(content=content, tool_calls=deltas)
        return None

    @staticmethod
    def _bodies(text: str) -> list[tuple[str, bool]]:
        """(body, whether its </call> came) of each call begun in ``text``."""
        bodies = []
        at = text.find(START)
        while at >= 0:
            body_start = at + len(START)
            end = text.find(END, body_start)
            if end < 0:
                body = text[body_start:]
                overlap = partial_tag_overlap(body, END)
                bodies.append((body[: len(body) - overlap], False))
                break
            bodies.append((text[body_start:end], True))
            at = text.find(START, end + len(END))
        return bodies

    def _arguments(self, index: int, body: str, closed: bool) -> str | None:
        """The arguments' text that may be sent: all of it once the call is closed (less the call
        object's closing brace), else all but the closing braces it ends with."""
        found = ARGUMENTS.search(body)
        if found is None:
            return None
        try:
            self.prev_tool_call_arr[index]["arguments"] = json.loads(body)["arguments"]
        except (ValueError, KeyError, TypeError):
            pass
        raw = body[found.end() :].rstrip()
        if closed:
            return raw[:-1].rstrip() if raw.endswith("}") else raw
        return raw.rstrip("} \t\r\n")
