"""``dyn frontend``'s media flags, spelled and shaped as ``vllm serve`` takes them
(``--allowed-local-media-path DIR``, ``--allowed-media-domains a b`` with argparse's
``nargs='+'``, ``--limit-mm-per-prompt '{"image": 4}'`` or ``--limit-mm-per-prompt.image 4``),
filling ``FrontendSettings.media``; a bad value stops the command before anything starts. The
engine's processing flags (``--mm-processor-kwargs``, ``--media-io-kwargs``) fill
``FrontendSettings.media_processing``, and ``dyn serve --engine vllm`` hands them to the frontend
and to its vLLM workers both."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dyn.cli.app import app
from dyn.cli.options import expand_dotted, expand_multi_value
from dyn.core.frontend.media import MediaSettings

runner = CliRunner()


@pytest.fixture
def started(monkeypatch):
    """The settings ``dyn frontend`` would run with (``run_frontend`` replaced)."""
    seen = []
    monkeypatch.setattr("dyn.core.frontend.server.run_frontend", seen.append)
    return seen


def frontend(*args: str):
    return runner.invoke(app, expand_multi_value(expand_dotted(["frontend", *args])))


def test_media_flags_fill_the_frontend_s_media_settings(started, tmp_path):
    result = frontend(
        "--allowed-local-media-path",
        str(tmp_path),
        "--allowed-media-domains",
        "upload.wikimedia.org",
        "Example.com,cdn.example.com",
        "--limit-mm-per-prompt",
        '{"image": 2, "video": {"count": 0, "num_frames": 8}}',
        "--max-media-bytes",
        "1000",
        "--max-request-media-bytes",
        "3000",
        "--media-fetch-timeout",
        "2.5",
        "--max-image-pixels",
        "4000000",
    )
    assert result.exit_code == 0, result.output
    [settings] = started
    assert settings.media == MediaSettings(
        allowed_local_media_path=str(tmp_path.resolve()),
        allowed_media_domains=("upload.wikimedia.org", "example.com", "cdn.example.com"),
        limit_mm_per_prompt={"image": 2, "video": 0},
        max_media_bytes=1000,
        max_request_media_bytes=3000,
        fetch_timeout_s=2.5,
        max_image_pixels=4_000_000,
    )


def test_defaults_are_vllm_s_where_vllm_has_one(started):
    assert frontend().exit_code == 0
    media = started[0].media
    assert media == MediaSettings()
    assert media.allowed_local_media_path is None and media.allowed_media_domains == ()
    assert [media.limit(m) for m in ("image", "audio", "video")] == [999, 999, 999]
    assert [media.timeout_s(m) for m in ("image", "audio", "video")] == [5.0, 10.0, 30.0]


def test_limit_mm_per_prompt_one_key_at_a_time_as_vllm_s_parser_takes_it(started):
    result = frontend("--limit-mm-per-prompt.image", "3", "--limit-mm-per-prompt.audio=1")
    assert result.exit_code == 0, result.output
    assert started[0].media.limit_mm_per_prompt == {"image": 3, "audio": 1}


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--allowed-local-media-path", "/no/such/dir"],
            "--allowed-local-media-path /no/such/dir: does not exist",
        ),
        (["--limit-mm-per-prompt", "image=4"], "--limit-mm-per-prompt: not JSON"),
        (["--limit-mm-per-prompt", '{"vision_chunk": 1}'], "unknown modality 'vision_chunk'"),
        (["--limit-mm-per-prompt", '{"image": -1}'], "image must be a count of 0 or more"),
        (["--allowed-media-domains", "https://example.com"], "give host names"),
        (["--max-image-pixels", "999999999"], "--max-image-pixels"),
        (["--mm-processor-kwargs", "max_pixels=4"], "--mm-processor-kwargs: not JSON"),
        (["--media-io-kwargs", '{"video": 1}'], "--media-io-kwargs: 'video' must map to an object"),
    ],
)
def test_bad_media_flags_stop_the_frontend_before_it_starts(started, args, says):
    result = frontend(*args)
    assert result.exit_code == 2 and says in result.output, result.output
    assert started == []


def test_dotted_flags_merge_into_one_json_value_where_the_first_was():
    args = ["serve", "--limit-mm-per-prompt.image", "4", "--x", "--limit-mm-per-prompt.video.count=0"]
    assert expand_dotted(args) == [
        "serve",
        "--limit-mm-per-prompt",
        '{"image": 4, "video": {"count": 0}}',
        "--x",
    ]
    untouched = ["--limit-mm-per-prompt", '{"image": 1}', "--", "--limit-mm-per-prompt.image", "3"]
    assert expand_dotted(untouched) == untouched


PROCESSING = ("--mm-processor-kwargs", '{"max_pixels": 12544}', "--media-io-kwargs", '{"video": {"fps": 4}}')


def test_the_engines_processing_flags_fill_the_frontends_media_processing(started):
    from dyn.core.model.multimodal import MediaProcessing

    result = frontend(*PROCESSING)
    assert result.exit_code == 0, result.output
    (settings,) = started
    assert settings.media_processing == MediaProcessing({"max_pixels": 12544}, {"video": {"fps": 4}})


def test_dyn_serve_hands_the_processing_flags_to_the_frontend_and_its_vllm_workers(monkeypatch):
    configs = []
    monkeypatch.setattr("dyn.core.serve.run_stack", lambda config, **_: configs.append(config) or 0)
    result = runner.invoke(app, ["serve", "--engine", "vllm", "--workers", "1", *PROCESSING])
    assert result.exit_code == 0, result.output
    (config,) = configs
    for argv in (config.frontend.argv, config.workers[0].argv):
        assert list(argv[-4:]) == list(PROCESSING)
