"""Images, audio and video in chat messages, loaded and checked once in the frontend
(``dyn.core.frontend.media``; issue 34 item 1).

Where each expected shape comes from (vLLM 0.32):

- Part shapes: ``vllm/renderers/chat_utils.py`` (``MM_PARSER_MAP``, and
  ``_parse_chat_message_content_mm_part`` for parts without ``type``: ``{"image_url": "<url>"}``).
- URL kinds and their refusals: ``vllm/multimodal/media/connector.py`` (``MediaConnector``:
  base64 ``data:`` URLs only, ``file://`` under ``--allowed-local-media-path``, http(s) hosts in
  ``--allowed-media-domains``).
- The count message: ``vllm/multimodal/processing/context.py`` (``validate_num_items``: "At most
  N image(s) may be provided in one prompt.").

HTTP is served by a small server in the test's own event loop on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import socket
import struct
import sys
import time
import wave
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest
from PIL import Image

from dyn.core.errors import ConfigError
from dyn.core.frontend import media
from dyn.core.frontend.media import (
    LoadedMedia,
    MediaSettings,
    is_media_part,
    load_media,
    media_parts,
    parse_limit_mm_per_prompt,
)
from dyn.core.messages import MediaItem
from dyn.core.protocol.errors import ApiError
from tests.media_clips import clip

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def png(size: tuple[int, int] = (4, 3), color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def jpeg(size: tuple[int, int] = (8, 8)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, "blue").save(out, "JPEG")
    return out.getvalue()


def wav(frames: int = 1600, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\1" * frames)
    return out.getvalue()


def float_wav(frames: int = 800, rate: int = 8000) -> bytes:
    """A 32-bit float WAV (format 3), which Python 3.11's ``wave`` cannot read."""
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    data = b"\0\0\0\0" * frames
    body = (
        b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    )
    return b"RIFF" + struct.pack("<I", len(body)) + body


def encoded(fmt: str, frames: int = 8000, rate: int = 16000) -> bytes:
    """A real ``fmt`` clip ("FLAC", "OGG" Vorbis, "MP3") of ``frames`` silent samples, by soundfile."""
    import numpy as np
    import soundfile

    out = io.BytesIO()
    subtype = {"OGG": "VORBIS", "MP3": "MPEG_LAYER_III"}.get(fmt)
    soundfile.write(out, np.zeros(frames, dtype="float32"), rate, format=fmt, subtype=subtype)
    return out.getvalue()


def png_declaring(width: int, height: int) -> bytes:
    """A small PNG whose header declares ``width`` x ``height`` (a decompression bomb's shape)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image(url, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def chat(*parts, text: str = "What is this?") -> list[dict]:
    return [
        {"role": "system", "content": "You look at things."},
        {"role": "user", "content": [{"type": "text", "text": text}, *parts]},
    ]


async def refused(messages, settings: MediaSettings = MediaSettings(), **kwargs) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await load_media(messages, settings, **kwargs)
    assert caught.value.status == 400
    return caught.value


# ------------------------------------------------------------------ shapes, data URLs, hashes


async def test_a_data_url_image_loads_as_sent_with_its_sha256_size_and_format():
    sent = png((5, 7))
    [item] = await load_media(chat(image(data_url(sent), detail="high")), MediaSettings())
    assert item == LoadedMedia(
        "image",
        sent,
        "image/png",
        hashlib.sha256(sent).hexdigest(),
        1,
        1,
        "messages[1].content[1].image_url",
        5,
        7,
    )
    assert item.item(3, 9) == MediaItem("image", sent, "image/png", item.mm_hash, 3, 9)


async def test_every_part_shape_vllm_takes_loads_in_order_of_appearance():
    a, b = png(color="red"), jpeg()
    parts = [
        {"image_url": data_url(a)},  # no type: vLLM's simple form
        {"type": "image_url", "image_url": data_url(b, "image/jpeg")},
        {"type": "input_image", "image_url": data_url(a), "detail": "auto"},  # Responses API
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav()).decode(), "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": data_url(encoded("MP3"), "audio/mpeg")}},
        {"type": "video_url", "video_url": {"url": data_url(clip(), "video/mp4")}},
        {"type": "image_url", "image_url": {"url": data_url(a)}, "uuid": "client-id"},  # uuid beside data
    ]
    messages = [{"role": "user", "content": "plain text"}, {"role": "user", "content": parts}]
    loaded = await load_media(messages, MediaSettings())
    assert [(m.modality, m.mime, m.part) for m in loaded] == [
        ("image", "image/png", 0),
        ("image", "image/jpeg", 1),
        ("image", "image/png", 2),
        ("audio", "audio/wav", 3),
        ("audio", "audio/mpeg", 4),
        ("video", "video/mp4", 5),
        ("image", "image/png", 6),
    ]
    assert loaded[0].mm_hash == loaded[2].mm_hash == loaded[6].mm_hash != loaded[1].mm_hash
    assert (loaded[3].frames, loaded[3].sample_rate) == (1600, 16000)
    assert [m.param for m in loaded][3] == "messages[1].content[3].input_audio"
    assert (loaded[5].frames, loaded[5].fps, loaded[5].width, loaded[5].height) == (10, 8.0, 64, 48)


async def test_text_only_messages_and_parts_that_are_not_media_load_nothing():
    """What is not media is the chat template's to accept or refuse."""
    messages = chat(
        {"type": "text", "text": "more"},
        {"type": "refusal", "refusal": "no"},
        {"type": {"odd": 1}, "image_url": "x"},
        {"type": 5},
        "a string part",
    )
    odd = [{"role": "assistant", "content": None}, "not a message", {"content": {"image_url": "x"}}]
    assert await load_media(messages + odd, MediaSettings()) == []


@pytest.mark.parametrize(
    "part, param, says",
    [
        (
            {"type": "image_pil", "image_pil": None},
            "messages[1].content[1]",
            "image_pil parts are not supported",
        ),
        (
            {"type": "image_embeds", "image_embeds": "AAAA"},
            "messages[1].content[1]",
            "precomputed embeddings",
        ),
        ({"audio_embeds": "AAAA"}, "messages[1].content[1]", "audio_embeds parts are not supported"),
        ({"type": "image_url", "uuid": "abc"}, "messages[1].content[1].image_url", "references by uuid"),
        ({"type": "image_url", "image_url": {}}, "messages[1].content[1].image_url", "must hold a URL"),
        (
            {"type": "input_image", "file_id": "file-1"},
            "messages[1].content[1].file_id",
            "send an image_url here",
        ),
        (
            {"type": "input_audio", "input_audio": {"format": "wav"}},
            "messages[1].content[1].input_audio",
            "base64",
        ),
        (
            image("ftp://example.com/a.png"),
            "messages[1].content[1].image_url",
            "not a data:, http(s) or file URL",
        ),
        (image("a.png"), "messages[1].content[1].image_url", "not a data:, http(s) or file URL"),
        (image("data:image/png,%89PNG"), "messages[1].content[1].image_url", "only base64 data: URLs"),
        (image("data:image/png;base64"), "messages[1].content[1].image_url", "no ','"),
        (image("data:image/png;base64,not*base64"), "messages[1].content[1].image_url", "not valid"),
    ],
)
async def test_parts_dyn_cannot_use_are_a_400_naming_the_part(part, param, says):
    error = await refused(chat(part))
    assert error.param == param and says in error.message, error.message


# ------------------------------------------------------------------------------- bounds


async def test_counts_per_modality_are_checked_before_anything_is_loaded(monkeypatch):
    def never(*args):
        raise AssertionError("loaded before counting")

    monkeypatch.setattr(media, "_load", never)
    settings = MediaSettings(limit_mm_per_prompt={"image": 1, "audio": 0})
    two_images = chat(image("http://192.0.2.1/a.png"), image("/no/such/file.png"))
    error = await refused(two_images, settings)
    assert error.param == "messages" and error.message.startswith(
        "At most 1 image(s) may be provided in one prompt; this request has 2."
    )
    assert "--limit-mm-per-prompt" in error.message
    error = await refused(chat({"type": "audio_url", "audio_url": "http://192.0.2.1/a.wav"}), settings)
    assert error.message.startswith("At most 0 audio(s)")
    # vLLM's default for a modality not named is 999
    assert MediaSettings().limit("video") == 999 and settings.limit("video") == 999


async def test_an_oversized_base64_item_is_refused_by_its_length_without_decoding(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("decoded")

    settings = MediaSettings(max_media_bytes=300)
    sent = data_url(os.urandom(301))
    monkeypatch.setattr(media.base64, "b64decode", never)
    error = await refused(chat(image(sent)), settings)
    assert error.param == "messages[1].content[1].image_url"
    assert "larger than 300 bytes" in error.message and "--max-media-bytes" in error.message
    audio = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(bytes(400)).decode(), "format": "wav"},
    }
    assert "--max-media-bytes" in (await refused(chat(audio), settings)).message
    monkeypatch.undo()
    # one at the bound loads
    at_bound = png((1, 1))
    [item] = await load_media(chat(image(data_url(at_bound))), MediaSettings(max_media_bytes=len(at_bound)))
    assert item.data == at_bound


async def test_a_request_s_media_together_are_bounded_too():
    one = png((2, 2))
    settings = MediaSettings(max_media_bytes=len(one), max_request_media_bytes=len(one) * 2)
    assert len(await load_media(chat(image(data_url(one)), image(data_url(one))), settings)) == 2
    error = await refused(chat(*[image(data_url(one))] * 3), settings)
    assert "add up to more than" in error.message and "--max-request-media-bytes" in error.message


# ---------------------------------------------------------------------------- images


@pytest.mark.parametrize(
    "sent, says",
    [
        (png((20, 20))[:60], "could not be decoded"),
        (os.urandom(200), "could not be decoded"),
        (b"", "could not be decoded"),
        (b"GIF89a" + bytes(10), "could not be decoded"),
        (png_declaring(50_000, 50_000), "more than 178956970 pixels"),
    ],
    ids=["truncated PNG", "random bytes", "empty", "broken GIF", "decompression bomb"],
)
async def test_a_broken_image_is_a_400_naming_the_part(sent, says):
    error = await refused(chat(image(data_url(sent))))
    assert error.param == "messages[1].content[1].image_url" and says in error.message, error.message


async def test_the_pixel_bound_is_checked_from_the_header_before_decoding(monkeypatch):
    from PIL import ImageFile

    def never(self):
        raise AssertionError("decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", never)
    error = await refused(chat(image(data_url(png((200, 100))))), MediaSettings(max_image_pixels=19_999))
    assert "the image is 200x100, more than 19999 pixels" in error.message


async def test_formats_pillow_could_open_beyond_the_five_are_refused():
    out = io.BytesIO()
    Image.new("RGB", (2, 2)).save(out, "TIFF")
    assert "could not be decoded" in (await refused(chat(image(data_url(out.getvalue()))))).message
    for fmt, mime in [("WEBP", "image/webp"), ("GIF", "image/gif"), ("BMP", "image/bmp")]:
        out = io.BytesIO()
        Image.new("RGB", (3, 2), "green").save(out, fmt)
        [item] = await load_media(chat(image(data_url(out.getvalue()))), MediaSettings())
        assert (item.mime, item.width, item.height) == (mime, 3, 2)


# ----------------------------------------------------------------------------- audio, video


def audio(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


async def test_wav_headers_are_read_and_compressed_clips_are_decoded_to_count_their_frames():
    loaded = await load_media(
        chat(
            audio(wav(8000, 16000)),
            audio(float_wav()),
            audio(encoded("FLAC", 4000, 8000), "flac"),
            audio(encoded("OGG"), "ogg"),
            audio(encoded("MP3", 16000, 16000), "mp3"),
        ),
        MediaSettings(),
    )
    assert [(m.mime, m.frames, m.sample_rate) for m in loaded] == [
        ("audio/wav", 8000, 16000),
        ("audio/wav", 800, 8000),
        ("audio/flac", 4000, 8000),
        ("audio/ogg", 8000, 16000),
        ("audio/mpeg", 16000, 16000),
    ]


async def test_without_soundfile_a_compressed_clip_loads_with_its_length_unknown(monkeypatch):
    """The frontend's ``audio`` extra is optional: the clip is still recognised and passed on."""
    clip = encoded("FLAC")
    monkeypatch.setitem(sys.modules, "soundfile", None)  # import soundfile -> ImportError
    [flac] = await load_media(chat(audio(clip, "flac")), MediaSettings())
    assert (flac.mime, flac.frames, flac.sample_rate, flac.data) == ("audio/flac", None, None, clip)


@pytest.mark.parametrize(
    "sent, says",
    [
        (b"RIFF\x10\0\0\0WAVEjunk", "no fmt chunk"),
        (wav()[:30], "fmt chunk is truncated"),
        (wav()[:36], "no data chunk"),
        (wav(0), "holds no audio samples"),
        (wav().replace(b"fmt \x10\0\0\0\x01\0", b"fmt \x10\0\0\0\x55\0"), "sample format 0x55"),
        (b"\0" * 64, "not WAV, MP3, FLAC or Ogg"),
        (b"fLaC" + bytes(40), "audio/flac clip could not be decoded"),
        (b"OggS" + bytes(40), "audio/ogg clip could not be decoded"),
        (b"\xff\xfb\x90\x64" + bytes(60), "audio/mpeg clip could not be decoded"),
    ],
)
async def test_broken_audio_is_a_400_naming_the_part(sent, says):
    error = await refused(chat(audio(sent)))
    assert error.param == "messages[1].content[1].input_audio" and says in error.message, error.message


def video(data: bytes) -> dict:
    return {"type": "video_url", "video_url": {"url": data_url(data, "video/mp4")}}


async def test_videos_are_read_for_their_frames_rate_and_size_in_each_container():
    sent = {c: clip(12, 6.0, (80, 40), c) for c in ("mp4", "mov", "avi", "mkv", "webm")}
    loaded = await load_media(chat(*(video(data) for data in sent.values())), MediaSettings())
    assert [m.mime for m in loaded] == [
        "video/mp4",
        "video/quicktime",
        "video/x-msvideo",
        "video/x-matroska",
        "video/webm",
    ]
    assert {(m.frames, m.fps, m.width, m.height) for m in loaded} == {(12, 6.0, 80, 40)}
    assert loaded[0].data == sent["mp4"] and loaded[0].mm_hash == hashlib.sha256(sent["mp4"]).hexdigest()


@pytest.mark.parametrize(
    ("sent", "says"),
    [
        (png(), "is not MP4"),
        (clip()[:200], "could not be opened; send a whole MP4"),
        (b"\0\0\0\x18ftypmp42" + bytes(32), "could not be opened"),
        (clip(size=(400, 300)), "frames are 400x300, more than 100000 pixels"),
    ],
    ids=["not-a-video", "truncated", "header-only", "frames-too-large"],
)
async def test_a_video_that_cannot_be_read_is_a_400_naming_the_part(sent, says):
    error = await refused(chat(video(sent)), MediaSettings(max_image_pixels=100_000))
    assert error.param == "messages[1].content[1].video_url" and says in error.message, error.message


async def test_without_opencv_a_video_is_passed_on_by_its_container_magic_with_its_shape_unknown(monkeypatch):
    monkeypatch.setattr(media, "_opencv", lambda: None)
    (loaded,) = await load_media(chat(video(b"\0\0\0\x14ftypqt  " + bytes(20))), MediaSettings())
    assert loaded.mime == "video/quicktime"
    assert (loaded.frames, loaded.fps, loaded.width, loaded.height) == (None, None, None, None)


# ---------------------------------------------------------------------------- local files


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    allowed = tmp_path / "allowed"
    (allowed / "sub").mkdir(parents=True)
    (allowed / "sub" / "cat.png").write_bytes(png((6, 2)))
    (tmp_path / "secret.png").write_bytes(png((1, 1)))
    return allowed


async def test_files_under_the_allowed_directory_load_by_path_and_file_url(media_dir):
    settings = MediaSettings(allowed_local_media_path=str(media_dir))
    path = media_dir / "sub" / "cat.png"
    loaded = await load_media(
        chat(image(str(path)), image(path.as_uri()), image(f"file://localhost{path}")), settings
    )
    assert [(m.width, m.height) for m in loaded] == [(6, 2)] * 3
    assert loaded[0].data == path.read_bytes()


async def test_files_outside_the_allowed_directory_are_refused(media_dir):
    settings = MediaSettings(allowed_local_media_path=str(media_dir))
    (media_dir / "escape.png").symlink_to(media_dir.parent / "secret.png")
    (media_dir / "escape_dir").symlink_to(media_dir.parent, target_is_directory=True)
    for url in [
        str(media_dir / ".." / "secret.png"),
        f"file://{media_dir}/sub/../../secret.png",
        str(media_dir / "escape.png"),
        str(media_dir / "escape_dir" / "secret.png"),
        "/etc/passwd",
        str(media_dir.parent / "no-such-file.png"),  # outside: said the same whether it exists
    ]:
        error = await refused(chat(image(url)), settings)
        assert "is not under --allowed-local-media-path" in error.message, (url, error.message)
        assert error.param == "messages[1].content[1].image_url"


async def test_files_are_refused_without_the_flag_and_odd_files_without_a_hang(media_dir):
    error = await refused(chat(image(str(media_dir / "sub" / "cat.png"))))
    assert "reads no local files" in error.message and "--allowed-local-media-path" in error.message
    settings = MediaSettings(allowed_local_media_path=str(media_dir), max_media_bytes=100)
    os.mkfifo(media_dir / "fifo")  # opening it blocking would wait for a writer forever
    (media_dir / "big.png").write_bytes(bytes(101))
    cases = {
        str(media_dir / "fifo"): "is not a regular file",
        str(media_dir / "sub"): "is not a regular file",
        str(media_dir / "missing.png"): "cannot be read",
        str(media_dir / "big.png"): "larger than 100 bytes",
        "file://example.com/x.png": "not host 'example.com'",
    }
    for url, says in cases.items():
        with anyio.fail_after(5):
            error = await refused(chat(image(url)), settings)
        assert says in error.message, (url, error.message)


def test_the_allowed_directory_must_exist_and_be_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        MediaSettings(allowed_local_media_path=str(tmp_path / "nope"))
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        MediaSettings(allowed_local_media_path=str(tmp_path / "f"))
    link = tmp_path / "link"
    link.symlink_to(tmp_path, target_is_directory=True)
    assert MediaSettings(allowed_local_media_path=str(link)).allowed_local_media_path == str(
        tmp_path.resolve()
    )


# ---------------------------------------------------------------------------------- http(s)

Handler = Callable[[anyio.abc.SocketStream, str], Awaitable[None]]


async def answer(stream, status: str, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
    head = {"content-length": str(len(body)), "connection": "close", **(headers or {})}
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    await stream.send(f"HTTP/1.1 {status}\r\n{lines}\r\n".encode() + body)


class Server:
    """A one-route-per-path HTTP/1.1 server in the test's event loop (127.0.0.1, a free port)."""

    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.url = ""
        self.sent_until_closed: list[int] = []

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                try:
                    request += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
            path = request.split(b" ", 2)[1].decode()
            handler = self.routes.get(path)
            try:
                if handler is None:
                    await answer(stream, "404 Not Found", b"no")
                else:
                    await handler(stream, path)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
                pass


@asynccontextmanager
async def serving() -> AsyncIterator[Server]:
    server = Server()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    server.url = f"http://127.0.0.1:{port}"
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.handle)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()


def route(server: Server, path: str, status: str = "200 OK", body: bytes = b"", **headers: str) -> str:
    async def handler(stream, _path):
        await answer(stream, status, body, {k.replace("_", "-"): v for k, v in headers.items()})

    server.routes[path] = handler
    return server.url + path


async def test_http_images_are_fetched_following_redirects_within_bounds():
    cat = png((9, 4))
    async with serving() as server:
        url = route(server, "/cat.png", body=cat, content_type="image/png")
        route(server, "/moved", "302 Found", location="/cat.png")
        route(server, "/moved-twice", "301 Moved Permanently", location=server.url + "/moved")
        route(server, "/gz", body=gzip.compress(cat), content_encoding="gzip")
        loaded = await load_media(
            chat(image(url), image(server.url + "/moved-twice"), {"image_url": server.url + "/gz"}),
            MediaSettings(allowed_media_domains=("127.0.0.1",)),
        )
    assert [(m.data, m.width, m.mime) for m in loaded] == [(cat, 9, "image/png")] * 3


async def test_fetches_that_fail_are_a_400_that_says_why():
    async with serving() as server:
        route(server, "/file", "302 Found", location="file:///etc/passwd")
        route(server, "/loop", "307 Temporary Redirect", location="/loop")
        route(server, "/elsewhere", "302 Found", location=server.url.replace("127.0.0.1", "localhost") + "/x")
        route(server, "/br", body=b"xx", content_encoding="br")
        route(server, "/cut-gz", body=gzip.compress(png())[:-12], content_encoding="gzip")
        route(server, "/bad-gz", body=b"not gzip at all", content_encoding="gzip")
        settings = MediaSettings(allowed_media_domains=("127.0.0.1",))
        cases = {
            "/file": "redirects to a file: URL; only http and https are followed",
            "/loop": "redirects more than 10 times",
            "/elsewhere": "localhost is not one of the allowed media domains (127.0.0.1",
            "/missing": "answered HTTP 404",
            "/br": "Content-Encoding br",
            "/cut-gz": "its gzip body is truncated",
            "/bad-gz": "its gzip body is broken",
        }
        for path, says in cases.items():
            error = await refused(chat(image(server.url + path)), settings)
            assert error.param == "messages[1].content[1].image_url"
            assert says in error.message, (path, error.message)
        error = await refused(
            chat(image(server.url + "/x")), MediaSettings(allowed_media_domains=("example.com",))
        )
        assert "127.0.0.1 is not one of the allowed media domains" in error.message


async def test_an_unreachable_host_is_a_400_not_a_500_nor_a_hang():
    with socket.socket() as probe:  # a free port nobody listens on: refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/a.png"
    with anyio.fail_after(10):
        error = await refused(chat(image(url)))
    assert error.message.startswith(
        f"messages[1].content[1].image_url: {url} could not be fetched: ConnectError"
    )


async def test_a_body_over_the_bound_is_cut_off_while_streaming():
    async def endless(stream, _path):
        await stream.send(b"HTTP/1.1 200 OK\r\ncontent-type: image/png\r\n\r\n")
        sent = 0
        try:
            while sent < 1 << 30:
                await stream.send(b"\0" * 65536)
                sent += 65536
        finally:
            server.sent_until_closed.append(sent)

    async with serving() as server:
        server.routes["/endless"] = endless
        route(server, "/declared", body=bytes(5000))
        route(server, "/bomb", body=gzip.compress(bytes(50 << 20)), content_encoding="gzip")
        settings = MediaSettings(max_media_bytes=4096)
        for path in ("/endless", "/declared", "/bomb"):
            with anyio.fail_after(20):
                error = await refused(chat(image(server.url + path)), settings)
            assert "larger than 4096 bytes" in error.message, (path, error.message)
        with anyio.fail_after(10):
            while not server.sent_until_closed:
                await anyio.sleep(0.01)
    assert server.sent_until_closed[0] < 64 << 20, server.sent_until_closed  # socket buffers at most


async def test_a_slow_server_is_a_400_after_the_fetch_timeout():
    async def slow(stream, _path):
        await stream.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + png()[:10])
        await anyio.sleep(60)

    async with serving() as server:
        server.routes["/slow"] = slow
        started = time.monotonic()
        error = await refused(chat(image(server.url + "/slow")), MediaSettings(fetch_timeout_s=0.3))
    assert time.monotonic() - started < 5
    assert "could not be fetched: no complete answer within 0.3 s" in error.message


async def test_the_first_failing_part_is_reported_and_the_others_stop():
    async def slow(stream, _path):
        await anyio.sleep(60)

    async with serving() as server:
        server.routes["/slow"] = slow
        started = time.monotonic()
        error = await refused(chat(image(server.url + "/slow"), image(data_url(b"broken"))))
    assert time.monotonic() - started < 4  # not the 5 s image fetch timeout
    assert error.param == "messages[1].content[2].image_url"


# ------------------------------------------------------------------------------- settings


def test_settings_refuse_bad_values_with_a_sentence():
    for kwargs, says in [
        ({"limit_mm_per_prompt": {"vision_chunk": 1}}, "unknown modality 'vision_chunk'"),
        ({"limit_mm_per_prompt": {"image": -1}}, "image must be a count of 0 or more"),
        ({"allowed_media_domains": ("https://example.com",)}, "give host names"),
        ({"max_media_bytes": 0}, "--max-media-bytes must be at least 1"),
        ({"max_image_pixels": 10**9}, "--max-image-pixels can be at most 178956970"),
        ({"fetch_timeout_s": 0.0}, "--media-fetch-timeout must be more than 0"),
    ]:
        with pytest.raises(ConfigError, match=says):
            MediaSettings(**kwargs)
    assert MediaSettings(allowed_media_domains=(" Example.COM",)).allowed_media_domains == ("example.com",)
    assert (
        MediaSettings().timeout_s("video") == 30.0
        and MediaSettings(fetch_timeout_s=2).timeout_s("image") == 2
    )


def test_limit_mm_per_prompt_takes_vllm_s_json_forms():
    assert parse_limit_mm_per_prompt('{"image": 4, "video": 0}') == {"image": 4, "video": 0}
    assert parse_limit_mm_per_prompt('{"image": 2, "video": {"count": 1, "num_frames": 32}}') == {
        "image": 2,
        "video": 1,
    }
    for text, says in [("image=4", "not JSON"), ("[1]", "JSON object"), ('{"image": "4"}', "a count")]:
        with pytest.raises(ConfigError, match=says):
            parse_limit_mm_per_prompt(text)


@pytest.mark.parametrize(
    "part,media",
    [
        ({"type": "image_url", "image_url": {"url": "x"}}, True),
        ({"type": "input_image", "image_url": "x"}, True),
        ({"type": "input_audio", "input_audio": {"data": "x"}}, True),
        ({"type": "audio_url", "audio_url": {"url": "x"}}, True),
        ({"type": "video_url", "video_url": {"url": "x"}}, True),
        ({"type": "image_embeds", "image_embeds": "x"}, True),
        ({"image_url": {"url": "x"}}, True),
        ({"type": "text", "uuid": "u", "image_url": "x"}, True),
        ({"type": "image_url", "uuid": "u"}, True),  # a uuid-only reference: refused as media
        ({"type": {"not": "a name"}}, False),
        ({"type": "text", "text": "hi"}, False),
        ({"role": "user", "content": "hi"}, False),
        ({"id": "c", "type": "function", "function": {"name": "f"}}, False),
    ],
)
def test_is_media_part_agrees_with_what_media_parts_takes(part, media):
    """The cheap test the prompt-size bound uses picks out the parts ``media_parts`` takes (or
    refuses as media)."""
    assert is_media_part(part) is media
    try:
        found = bool(media_parts([{"role": "user", "content": [part]}]))
    except ApiError:
        found = True  # refused as media: a part of its own bounds all the same
    assert found is media
