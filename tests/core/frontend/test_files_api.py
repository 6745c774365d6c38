"""The Files API (``dyn.core.frontend.apis.files``): uploads through the ``openai`` and
``anthropic`` SDKs in process, read back, listed, deleted, and read by id in a Responses
``input_file`` and a Messages ``file`` document (the text checked in the prompt the engine
receives); bad uploads are 4xx that say what to fix, in the caller's API's error shape; the
store's bounds and the multipart reader's."""

from __future__ import annotations

import dataclasses

import anthropic
import msgspec
import openai
import pytest
from typer.testing import CliRunner

from dyn.cli.app import app
from dyn.core.frontend.apis.files.multipart import MAX_HEAD_BYTES, MAX_PARTS, form_parts
from dyn.core.frontend.apis.files.store import MAX_FILES_PER_REQUEST, FileStore
from dyn.core.frontend.endpoints.generate import MAX_BODY_BYTES
from dyn.core.protocol.errors import ApiError
from tests.core.frontend.conftest import asgi_call
from tests.core.frontend.fake_workers import reply, tokenizer
from tests.core.frontend.test_anthropic_api import MODEL, client
from tests.core.frontend.test_responses_api import sdk
from tests.pdf_files import pdf_of

pytestmark = pytest.mark.anyio

FILES_BETA = ["files-api-2025-04-14"]


async def test_the_openai_sdk_uploads_reads_lists_and_deletes_and_a_response_reads_the_file(make_frontend):
    async with make_frontend(workers=1, script=reply("Noted.")) as fe:
        oai = sdk(fe)
        up = await oai.files.create(file=("notes.md", b"# Risks\nFX", "text/markdown"), purpose="user_data")
        assert up.id.startswith("file-") and up.bytes == 10 and up.filename == "notes.md"
        assert up.purpose == "user_data" and up.status == "processed" and up.expires_at > up.created_at
        assert (await oai.files.retrieve(up.id)).filename == "notes.md"
        assert (await oai.files.content(up.id)).read() == b"# Risks\nFX"
        other = await oai.files.create(file=("b.txt", b"b"), purpose="assistants")
        await oai.files.retrieve(up.id)  # used since, still the older upload
        listed = [f.id async for f in oai.files.list()]
        assert listed == [other.id, up.id]  # newest first
        assert [f.id async for f in oai.files.list(purpose="user_data")] == [up.id]
        part = {"type": "input_file", "file_id": up.id}
        turn = {"role": "user", "content": [part, {"type": "input_text", "text": "Sum up."}]}
        answer = await oai.responses.create(model="dyn-tiny", input=[turn])
        prompt = tokenizer().decode(fe.fleet.requests[0].token_ids)
        assert answer.output_text == "Noted." and "notes.md\n\n# Risks\nFX" in prompt
        assert (await oai.files.delete(up.id)).deleted
        with pytest.raises(openai.NotFoundError) as gone:
            await oai.responses.create(model="dyn-tiny", input=[turn])
        assert gone.value.body["param"] == "input[0].content[0].file_id"
        with pytest.raises(openai.NotFoundError):
            await oai.files.retrieve(up.id)


async def test_the_anthropic_sdk_uploads_a_pdf_that_a_message_reads_by_id(make_frontend):
    async with make_frontend(workers=1, script=reply("Up 12%.")) as fe:
        sdk_client = client(fe)
        files = sdk_client.beta.files
        up = await files.upload(
            file=("q3.pdf", pdf_of("Revenue grew 12 percent"), "application/pdf"), betas=FILES_BETA
        )
        assert up.id.startswith("file_") and up.mime_type == "application/pdf" and up.filename == "q3.pdf"
        assert (await files.retrieve_metadata(up.id, betas=FILES_BETA)).size_bytes == up.size_bytes
        assert [f.id async for f in files.list(betas=FILES_BETA)] == [up.id]
        document = {"type": "document", "source": {"type": "file", "file_id": up.id}, "title": "Q3"}
        answer = await sdk_client.beta.messages.create(
            model=MODEL,
            max_tokens=16,
            betas=FILES_BETA,
            messages=[{"role": "user", "content": [document, {"type": "text", "text": "Sum up."}]}],
        )
        prompt = tokenizer().decode(fe.fleet.requests[0].token_ids)
        assert answer.content[0].text == "Up 12%." and "Q3\n\nRevenue grew 12 percent" in prompt
        assert (await files.delete(up.id, betas=FILES_BETA)).type == "file_deleted"
        with pytest.raises(anthropic.NotFoundError) as gone:
            await files.retrieve_metadata(up.id, betas=FILES_BETA)
        assert gone.value.body["error"]["type"] == "not_found_error"


def multipart(*parts: tuple[str, str | None, bytes], boundary: str = "b0undary") -> bytes:
    body = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"
    return body + f"--{boundary}--\r\n".encode()


FORM = (b"content-type", b"multipart/form-data; boundary=b0undary")


@pytest.mark.parametrize(
    ("body", "headers", "status", "words"),
    [
        (b'{"file": "x"}', [(b"content-type", b"application/json")], 415, "multipart/form-data"),
        (multipart(("purpose", None, b"user_data")), [FORM], 400, "a 'file' part"),
        (multipart(("file", "a.txt", b"a")), [FORM], 400, "purpose must be one of"),
        (multipart(("file", "a.txt", b"a"), ("purpose", None, b"secrets")), [FORM], 400, "'secrets'"),
        (b"--b0undary\r\nno head\r\n--b0undary--", [FORM], 400, "headers"),
        (b"--b0undary\r\n\r\nx\r\n", [FORM], 400, "closing boundary"),
        (multipart(("file", "a", b"a")), [(b"content-type", b"multipart/form-data")], 400, "boundary"),
        (
            multipart(*[("f", None, b"x")] * (MAX_PARTS + 1)),
            [FORM],
            400,
            f"at most {MAX_PARTS} parts",
        ),
    ],
)
async def test_a_bad_upload_is_a_4xx_that_says_what_to_fix(frontend, body, headers, status, words):
    sent = await asgi_call(frontend.app, "POST", "/v1/files", body, headers)
    assert sent[0]["status"] == status and words in sent[1]["body"].decode(), sent[1]["body"]
    assert frontend.app.file_store.bytes == 0


async def test_an_upload_over_the_body_limit_or_with_an_oversized_part_head_is_refused(frontend):
    body = multipart(("file", "big.bin", b"x" * (MAX_BODY_BYTES + 1)), ("purpose", None, b"batch"))
    sent = await asgi_call(frontend.app, "POST", "/v1/files", body, [FORM])
    assert sent[0]["status"] == 413 and b"upload a smaller file" in sent[1]["body"]
    head = b'--b0undary\r\nContent-Disposition: form-data; name="file"\r\nX-Pad: ' + b"p" * MAX_HEAD_BYTES
    sent = await asgi_call(frontend.app, "POST", "/v1/files", head + b"\r\n\r\nx\r\n--b0undary--\r\n", [FORM])
    assert sent[0]["status"] == 400 and f"at most {MAX_HEAD_BYTES} bytes".encode() in sent[1]["body"]
    assert frontend.app.file_store.bytes == 0


async def test_an_upload_larger_than_the_store_is_a_413_in_anthropics_shape(frontend):
    frontend.app.file_store = FileStore(max_bytes=4)
    headers = [FORM, (b"anthropic-version", b"2023-06-01")]
    sent = await asgi_call(frontend.app, "POST", "/v1/files", multipart(("file", "a.txt", b"hello")), headers)
    assert sent[0]["status"] == 413
    assert b'"type":"error"' in sent[1]["body"] and b"request_too_large" in sent[1]["body"]


async def test_unknown_files_and_paths_are_404s_and_a_bad_listing_query_a_400(frontend):
    for path in ("/v1/files/file-nope", "/v1/files/file-nope/content"):
        sent = await asgi_call(frontend.app, "GET", path)
        assert sent[0]["status"] == 404 and b"never uploaded" in sent[1]["body"]
    sent = await asgi_call(frontend.app, "POST", "/v1/files/file-nope/content")
    assert sent[0]["status"] == 405
    for query in ("limit=0", "limit=abc", "order=up"):
        sent = await asgi_call(frontend.app, "GET", f"/v1/files?{query}")
        assert sent[0]["status"] == 400, query


async def test_content_is_served_as_a_download_with_a_media_type_checked_at_upload(frontend):
    part = (
        b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="x.html"\r\n'
        b"Content-Type: text/html\x01evil\r\n\r\n<script>1</script>\r\n--b0undary--\r\n"
    )
    headers = [FORM, (b"anthropic-version", b"2023-06-01")]
    sent = await asgi_call(frontend.app, "POST", "/v1/files", part, headers)
    assert sent[0]["status"] == 200, sent[1]["body"]
    stored = msgspec.json.decode(sent[1]["body"])
    assert stored["mime_type"] == "application/octet-stream"
    sent = await asgi_call(frontend.app, "GET", f"/v1/files/{stored['id']}/content")
    assert sent[1]["body"] == b"<script>1</script>"
    got = dict(sent[0]["headers"])
    assert (
        got[b"content-type"] == b"application/octet-stream" and got[b"content-disposition"] == b"attachment"
    )
    assert got[b"x-content-type-options"] == b"nosniff"


def test_the_store_is_bounded_in_count_bytes_and_age():
    now = [0.0]
    store = FileStore(max_count=2, max_bytes=10, ttl_s=60, clock=lambda: now[0])
    a = store.add("file-", "a", "text/plain", "user_data", b"aaaa")
    b = store.add("file-", "b", "text/plain", "user_data", b"bbbb")
    c = store.add("file-", "c", "text/plain", "user_data", b"cc")
    assert a and b and c and store.get(a.id) is None and len(store) == 2  # the oldest went first
    assert store.add("file-", "d", "text/plain", "user_data", b"d" * 9) and store.bytes == 9
    assert store.add("file-", "big", "text/plain", "user_data", b"x" * 11) is None
    now[0] = 61
    assert list(store) == [] and store.bytes == 0


def test_the_multipart_reader_keeps_quoted_names_and_each_parts_type():
    body = (
        b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="a;b \\"q\\".md"\r\n'
        b"Content-Type: text/markdown\r\n\r\n# A\r\nB\r\n--b0undary--\r\n"
    )
    (part,) = form_parts(FORM[1], body).values()
    assert part.name == "file" and part.filename == 'a;b "q".md' and part.content_type == "text/markdown"
    assert part.data == b"# A\r\nB"
    inside = (
        b'--b0undary\r\nContent-Disposition: form-data; name="file"\r\n\r\nx--b0undary y\r\n--b0undary--\r\n'
    )
    assert (
        form_parts(FORM[1], inside)["file"].data == b"x--b0undary y"
    )  # a boundary's text not on its own line
    with pytest.raises(ApiError):
        form_parts(b"text/plain", body)


def test_the_store_flags_reach_the_frontends_settings(monkeypatch):
    started = []
    monkeypatch.setattr("dyn.core.frontend.server.run_frontend", started.append)
    flags = ["--files-store-max-entries", "3", "--files-store-max-bytes", "9", "--files-store-ttl-secs", "5"]
    result = CliRunner().invoke(app, ["frontend", *flags])
    assert result.exit_code == 0, result.output
    [settings] = started
    assert (settings.files_store_max_entries, settings.files_store_max_bytes, settings.files_store_ttl_s) == (
        3,
        9,
        5,
    )
    assert CliRunner().invoke(app, ["frontend", "--files-store-max-bytes", "0"]).exit_code != 0


async def test_the_store_bounds_in_the_settings_bound_the_apps_store(make_frontend):
    async with make_frontend(
        workers=1, files_store_max_entries=3, files_store_max_bytes=9, files_store_ttl_s=5
    ) as fe:
        store = fe.app.file_store
        assert (store.max_count, store.max_bytes, store.ttl_s) == (3, 9, 5)
        sent = await asgi_call(
            fe.app,
            "POST",
            "/v1/files",
            multipart(("file", "a", b"x" * 10), ("purpose", None, b"batch")),
            [FORM],
        )
        assert sent[0]["status"] == 413 and b"file store (9 bytes)" in sent[1]["body"]


async def test_a_request_reads_a_bounded_number_of_uploads_by_id(make_frontend):
    """Each file named is read again (a PDF parsed, an image loaded): a few bytes of ids must not
    make one request read a large upload thousands of times."""
    async with make_frontend(workers=1, script=reply("Ok.")) as fe:
        oai = sdk(fe)
        up = await oai.files.create(file=("a.txt", b"text"), purpose="user_data")
        parts = [{"type": "input_file", "file_id": up.id}] * (MAX_FILES_PER_REQUEST + 1)
        with pytest.raises(openai.BadRequestError) as many:
            await oai.responses.create(model="dyn-tiny", input=[{"role": "user", "content": parts}])
        assert f"at most {MAX_FILES_PER_REQUEST} uploaded files" in many.value.message
        assert many.value.body["param"] == f"input[0].content[{MAX_FILES_PER_REQUEST}].file_id"
        document = {"type": "document", "source": {"type": "file", "file_id": up.id}}
        with pytest.raises(anthropic.BadRequestError) as many:
            await client(fe).messages.create(
                model=MODEL,
                max_tokens=4,
                messages=[{"role": "user", "content": [document] * (MAX_FILES_PER_REQUEST + 1)}],
            )
        assert f"at most {MAX_FILES_PER_REQUEST} uploaded files" in many.value.message
        service = fe.app.models.resolve("dyn-tiny")
        service.media = dataclasses.replace(service.media, max_request_media_bytes=7)
        with pytest.raises(openai.BadRequestError) as big:
            await oai.responses.create(model="dyn-tiny", input=[{"role": "user", "content": parts[:2]}])
        assert "--max-request-media-bytes" in big.value.message
