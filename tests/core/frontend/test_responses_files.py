"""The Responses API's ``input_file`` parts read as text: a PDF and a text file in a user message
and in a function call's output, as data or fetched from a ``file_url``, through the ``openai``
SDK in process, the text checked in the prompt the engine receives; the parts it cannot read are
400s naming them."""

from __future__ import annotations

import base64

import pytest

from dyn.core.frontend.media import MediaSettings
from tests.core.frontend.fake_workers import reply, tokenizer
from tests.core.frontend.test_media import route, serving
from tests.core.frontend.test_responses_api import sdk
from tests.pdf_files import pdf_of

pytestmark = pytest.mark.anyio


def data_url(kind: str, data: bytes) -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


async def test_a_pdf_and_a_text_file_reach_the_model_as_text(make_frontend):
    pdf = {
        "type": "input_file",
        "filename": "q3.pdf",
        "file_data": data_url("application/pdf", pdf_of("Revenue grew 12 percent")),
    }
    notes = {
        "type": "input_file",
        "filename": "notes.md",
        "file_data": data_url("text/markdown", b"# Risks\nFX"),
    }
    bare = {"type": "input_file", "file_data": base64.b64encode(pdf_of("Costs fell")).decode()}
    turn = {"role": "user", "content": [pdf, notes, {"type": "input_text", "text": "Sum up."}]}
    call = {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": [bare]}
    async with make_frontend(workers=1, script=reply("Up 12%.")) as fe:
        answer = await sdk(fe).responses.create(model="dyn-tiny", input=[turn, call, output])
        prompt = tokenizer().decode(fe.fleet.requests[0].token_ids)
    assert answer.output_text == "Up 12%."
    assert "q3.pdf\n\nRevenue grew 12 percent" in prompt and "notes.md\n\n# Risks\nFX" in prompt
    assert "Costs fell" in prompt


@pytest.mark.parametrize(
    ("part", "param", "words"),
    [
        (
            {"type": "input_file", "filename": "a.txt"},
            "input[0].content[0]",
            "file_data, a file_url or a file_id",
        ),
        (
            {"type": "input_file", "file_data": data_url("image/png", b"x")},
            "input[0].content[0].file_data",
            "'image/png'",
        ),
        (
            {"type": "input_file", "file_data": "bm90IGEgZGF0YSB1cmw="},
            "input[0].content[0].file_data",
            "not a data URL",
        ),
        (
            {"type": "input_file", "file_data": data_url("text/plain", b"\xff\xfe")},
            "input[0].content[0].file_data",
            "UTF-8",
        ),
        (
            {"type": "input_file", "file_data": data_url("application/pdf", b"nope")},
            "input[0].content[0].file_data",
            "could not be read",
        ),
    ],
)
async def test_a_file_it_cannot_read_is_a_400_naming_the_part(make_frontend, part, param, words):
    body = {"model": "dyn-tiny", "input": [{"role": "user", "content": [part]}]}
    async with make_frontend(workers=1, script=reply("x")) as fe:
        r = await fe.client.post("/v1/responses", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert words in r.json()["error"]["message"] and not fe.fleet.requests


async def test_a_text_file_over_the_media_bound_is_a_400(make_frontend):
    part = {"type": "input_file", "file_data": data_url("text/plain", b"x" * 2048)}
    body = {"model": "dyn-tiny", "input": [{"role": "user", "content": [part]}]}
    async with make_frontend(workers=1, script=reply("x"), media=MediaSettings(max_media_bytes=1024)) as fe:
        r = await fe.client.post("/v1/responses", json=body)
    assert r.status_code == 400 and "--max-media-bytes" in r.json()["error"]["message"]


async def test_file_urls_are_fetched_and_read_as_files(make_frontend):
    async with serving() as server:
        pdf = route(server, "/q3.pdf", body=pdf_of("Revenue grew 12 percent"))
        notes = route(server, "/notes.md", body=b"# Risks\nFX")
        turn = {
            "role": "user",
            "content": [
                {"type": "input_file", "file_url": pdf, "filename": "q3.pdf"},
                {"type": "input_text", "text": "Sum up."},
            ],
        }
        call = {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"}
        output = {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_file", "file_url": notes}],
        }
        async with make_frontend(workers=1, script=reply("Up 12%.")) as fe:
            answer = await sdk(fe).responses.create(model="dyn-tiny", input=[turn, call, output])
            prompt = tokenizer().decode(fe.fleet.requests[0].token_ids)
            missing = {"type": "input_file", "file_url": server.url + "/gone.pdf"}
            r = await fe.client.post(
                "/v1/responses", json={"model": "dyn-tiny", "input": [{"role": "user", "content": [missing]}]}
            )
    assert answer.output_text == "Up 12%."
    assert "q3.pdf\n\nRevenue grew 12 percent" in prompt and "# Risks\nFX" in prompt
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "input[0].content[0].file_url"
    assert "answered HTTP 404" in error["message"] and len(fe.fleet.requests) == 1
