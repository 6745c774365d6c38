"""A system message after a conversation's first turns (Claude Code sends reminders so) on a model
whose chat template refuses one, as Gemma's and Mistral's do: the Messages API folds it into the
user turns (``fold_late_system``) where the template would fail, and leaves it where it renders."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dyn.core.frontend.apis.anthropic.adapter import fold_late_system
from dyn.core.model.info import TINY_MODEL_DIR
from tests.core.frontend.fake_workers import reply, tokenizer
from tests.core.frontend.test_anthropic_api import MODEL, client

pytestmark = pytest.mark.anyio

STRICT = """{%- for message in messages -%}
{%- if message['role'] == 'system' and not loop.first -%}
{{ raise_exception('System messages are only allowed at the start') }}
{%- endif -%}
{%- if loop.previtem is defined and loop.previtem['role'] == message['role'] -%}
{{ raise_exception('Conversation roles must alternate') }}
{%- endif -%}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""

TURNS = [
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": "Looking."},
    {"role": "system", "content": "Reminder: run the tests."},
    {"role": "user", "content": "Go on."},
]


def strict_model(directory: Path) -> Path:
    shutil.copytree(TINY_MODEL_DIR, directory)
    (directory / "chat_template.jinja").write_text(STRICT)
    return directory


def test_a_late_system_message_joins_the_user_turn_after_it():
    assert fold_late_system([{"role": "system", "content": "S"}, *TURNS]) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "Looking."},
        {"role": "user", "content": "Reminder: run the tests.\n\nGo on."},
    ]
    before_a_tool_turn = [*TURNS[:2], {"role": "tool", "content": "ok"}, TURNS[2]]
    assert fold_late_system(before_a_tool_turn)[-1] == {"role": "user", "content": "Reminder: run the tests."}
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]
    folded = fold_late_system([*TURNS[:3], {"role": "user", "content": parts}])
    assert folded[-1]["content"] == [
        {"type": "text", "text": "Reminder: run the tests."},
        {"type": "text", "text": "\n\n"},
        *parts,
    ]


async def test_a_template_that_refuses_it_gets_it_folded_and_one_that_takes_it_keeps_it(
    make_frontend, tmp_path
):
    async with make_frontend(
        workers=1, script=reply("Done."), model_path=str(strict_model(tmp_path / "strict" / MODEL))
    ) as fe:
        answer = await client(fe).messages.create(
            model=MODEL, max_tokens=8, system="Be brief.", messages=TURNS
        )
        counted = await client(fe).messages.count_tokens(model=MODEL, system="Be brief.", messages=TURNS)
        chat = await fe.client.post("/v1/chat/completions", json={"model": MODEL, "messages": TURNS})
        folded = tokenizer().decode(fe.fleet.requests[0].token_ids)
        assert not fe.app.models.resolve(MODEL).preprocessor.accepts_late_system()
    assert answer.content[0].text == "Done." and counted.input_tokens == answer.usage.input_tokens
    assert "<|im_start|>user\nReminder: run the tests.\n\nGo on.<|im_end|>" in folded
    assert chat.status_code == 400 and "only allowed at the start" in chat.text  # the template refuses
    async with make_frontend(workers=1, script=reply("Done.")) as fe:
        await client(fe).messages.create(model=MODEL, max_tokens=8, messages=TURNS)
        kept = tokenizer().decode(fe.fleet.requests[0].token_ids)
        assert fe.app.models.resolve(MODEL).preprocessor.accepts_late_system()
    assert "system\n\nReminder: run the tests.user" in kept  # dyn-tiny's template, special tokens skipped
