"""Anthropic's ``document`` blocks read as text: text and content sources in the adapter, PDFs
read with pypdf and URL sources fetched before it (``read_documents``), and a Messages request
with a PDF in a tool result (as Claude Code's Read tool sends one) through the SDK in process, the
text checked in the prompt the engine receives."""

from __future__ import annotations

import base64
import sys

import msgspec
import pytest

from dyn.core.frontend import documents
from dyn.core.frontend.apis.anthropic.adapter import adapt
from dyn.core.frontend.apis.anthropic.documents import read_documents
from dyn.core.frontend.apis.anthropic.protocol import MessagesRequest
from dyn.core.frontend.apis.files.store import FileStore
from dyn.core.frontend.documents import MAX_PDF_PAGES
from dyn.core.frontend.media import MediaSettings
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import decode_request
from tests.core.frontend.fake_workers import reply, tokenizer
from tests.core.frontend.test_anthropic_api import MODEL, client
from tests.core.frontend.test_media import route, serving
from tests.pdf_files import blank_pages, pdf_of

pytestmark = pytest.mark.anyio


def pdf_block(data: bytes, **fields) -> dict:
    source = {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(data).decode()}
    return {"type": "document", "source": source, **fields}


def request(*blocks: dict) -> MessagesRequest:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": list(blocks)}]}
    return decode_request(msgspec.json.encode(body), MessagesRequest)


async def read(req: MessagesRequest, media: MediaSettings | None = None) -> list:
    await read_documents(req.messages, media or MediaSettings(), FileStore())
    return adapt(req)[0].messages


def test_text_and_content_documents_read_with_their_title_and_context():
    text = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Body."}}
    titled = {**text, "title": "Notes", "context": "From the wiki."}
    content = {
        "type": "document",
        "source": {
            "type": "content",
            "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        },
    }
    messages = adapt(request(text, titled, content, {"type": "text", "text": "Summarize."}))[0].messages
    assert messages == [
        {"role": "user", "content": "Body.\nNotes\n\nFrom the wiki.\n\nBody.\nA\nB\nSummarize."}
    ]


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ({"type": "file"}, "a text, content, base64 PDF, url or file source"),
        ({"type": "content", "content": [{"type": "image"}]}, "holds text blocks"),
        ({"type": "base64", "media_type": "text/csv", "data": "YQ=="}, "base64 PDF"),
    ],
)
def test_sources_it_cannot_read_are_a_400_naming_the_source(source, words):
    with pytest.raises(ApiError) as bad:
        adapt(request({"type": "document", "source": source}))
    assert bad.value.status == 400 and words in bad.value.message
    assert bad.value.param.startswith("messages[0].content[0].source")


async def test_a_pdf_reads_as_its_pages_text_in_a_turn_and_in_a_tool_result():
    doc = pdf_block(pdf_of("Quarterly report", "Revenue grew 12 percent"), title="Q3")
    result = {"type": "tool_result", "tool_use_id": "r1", "content": [doc]}
    turn = await read(request(doc))
    assert "Q3" in turn[0]["content"] and "Revenue grew 12 percent" in turn[0]["content"]
    (tool,) = await read(request(result))
    assert tool["role"] == "tool" and "Quarterly report" in tool["content"]


@pytest.mark.parametrize(
    ("data", "media", "param", "words"),
    [
        (b"%PDF-1.4 not really", None, "source.data", "could not be read"),
        (blank_pages(MAX_PDF_PAGES + 1), None, "source.data", f"more than {MAX_PDF_PAGES}"),
        (pdf_of("x" * 64), MediaSettings(max_media_bytes=100), "source.data", "--max-media-bytes"),
    ],
)
async def test_a_pdf_it_cannot_take_is_a_400(data, media, param, words):
    with pytest.raises(ApiError) as bad:
        await read(request(pdf_block(data)), media)
    assert bad.value.status == 400 and words in bad.value.message
    assert bad.value.param == f"messages[0].content[0].{param}"


async def test_without_pypdf_a_pdf_is_a_400_that_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pypdf", None)
    with pytest.raises(ApiError) as bad:
        await read(request(pdf_block(pdf_of("x"))))
    assert "dyn[pdf]" in bad.value.message


async def test_claude_codes_read_of_a_pdf_reaches_the_model_as_text(make_frontend):
    messages = [
        {"role": "user", "content": "What does the report say?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "r1", "name": "Read", "input": {"file_path": "q3.pdf"}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "r1",
                    "content": [pdf_block(pdf_of("Revenue grew 12 percent"))],
                }
            ],
        },
    ]
    tools = [{"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object"}}]
    parser = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
    async with make_frontend(workers=1, script=reply("It grew."), **parser) as fe:
        answer = await client(fe).messages.create(model=MODEL, max_tokens=8, messages=messages, tools=tools)
        counted = await client(fe).messages.count_tokens(model=MODEL, messages=messages, tools=tools)
        prompt = tokenizer().decode(fe.fleet.requests[0].token_ids)
    assert answer.content[0].text == "It grew." and "Revenue grew 12 percent" in prompt
    assert counted.input_tokens == answer.usage.input_tokens


async def test_a_pdf_with_too_much_text_is_a_400(monkeypatch):
    monkeypatch.setattr(documents, "MAX_DOCUMENT_CHARS", 10)
    with pytest.raises(ApiError) as bad:
        await read(request(pdf_block(pdf_of("more than ten characters"))))
    assert bad.value.status == 400 and "over 10 characters" in bad.value.message


def url_block(url: str) -> dict:
    return {"type": "document", "source": {"type": "url", "url": url}, "title": "Fetched"}


async def test_url_documents_are_fetched_and_read_as_a_pdf_or_as_text(make_frontend):
    """A URL source is fetched (all of a request's at once) as a media item is: a PDF reads as
    its pages' text, any other body as UTF-8 text; in a turn, in a tool result, and through the
    SDK in process."""
    async with serving() as server:
        pdf = route(server, "/q3.pdf", body=pdf_of("Revenue grew 12 percent"), content_type="application/pdf")
        notes = route(server, "/notes.txt", body=b"Risks: FX", content_type="text/plain")
        req = request(url_block(pdf), {"type": "text", "text": "Sum up."})
        body = {"type": "tool_result", "tool_use_id": "r1", "content": [url_block(notes)]}
        (turn,) = await read(req)
        assert turn["content"] == "Fetched\n\nRevenue grew 12 percent\nSum up."
        tool_req = request(body)
        await read_documents(tool_req.messages, MediaSettings(), FileStore())
        assert tool_req.messages[0].content[0].content[0].source["data"] == "Risks: FX"
        async with make_frontend(workers=1, script=reply("Up 12%.")) as fe:
            messages = [{"role": "user", "content": [url_block(pdf), {"type": "text", "text": "Sum up."}]}]
            answer = await client(fe).messages.create(model=MODEL, max_tokens=8, messages=messages)
            prompt = tokenizer().decode(fe.fleet.requests[0].token_ids)
        assert answer.content[0].text == "Up 12%." and "Revenue grew 12 percent" in prompt


async def test_url_documents_that_cannot_be_read_are_a_400_naming_the_source():
    async with serving() as server:
        binary = route(server, "/blob", body=bytes(range(256)))
        big = route(server, "/big.txt", body=b"x" * 4096)
        cases = [
            (server.url + "/missing.pdf", MediaSettings(), "answered HTTP 404"),
            (binary, MediaSettings(), "neither a PDF nor UTF-8 text"),
            (big, MediaSettings(max_media_bytes=1024), "--max-media-bytes"),
            (big, MediaSettings(allowed_media_domains=("example.com",)), "allowed media domains"),
            ("ftp://127.0.0.1/a.pdf", MediaSettings(), "not an http(s) URL"),
        ]
        for url, media, words in cases:
            with pytest.raises(ApiError) as bad:
                await read(request({"type": "text", "text": "See:"}, url_block(url)), media)
            assert bad.value.status == 400 and words in bad.value.message, (url, bad.value.message)
            assert bad.value.param == "messages[0].content[1].source.url"
        with pytest.raises(ApiError) as many:
            await read(request(*[url_block(big)] * 11))
        assert "at most 10" in many.value.message and many.value.param == "messages[0].content[10].source.url"
