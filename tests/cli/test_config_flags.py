"""Settings declared once (``dyn.core.config``) become Typer options (``dyn.cli.config_flags``):
flag names, help, panel, range, default and environment twin all come from the field's declaration."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest
import typer
from typer.testing import CliRunner

from dyn.cli.config_flags import config_flags, flag_table
from dyn.core.config import declared_flags, flag


def _limit(value: int) -> int | None:
    return value or None


class Knobs(msgspec.Struct, kw_only=True, frozen=True):
    depth: Annotated[int, msgspec.Meta(ge=1, le=8), flag("--depth", panel="Knobs", help="How deep.")] = 2
    ratio: Annotated[Annotated[float, msgspec.Meta(ge=0.0)] | None, flag("--knob-ratio", help="A ratio.")] = (
        None
    )
    limit: Annotated[
        int | None,
        flag("--limit", cli_type=Annotated[int, msgspec.Meta(ge=0)], parse=_limit, help="0: none."),
    ] = 16
    fast: Annotated[bool, flag("--fast/--no-fast", help="Go fast.")] = True
    label: Annotated[str, flag("--label", default="x", help="A label.")] = "field-default"
    internal: int = 7

    def validate(self) -> Knobs:
        if self.label == "bad":
            raise ValueError("--label must not be bad")
        return self


def test_each_declared_field_becomes_one_option_named_after_its_flag():
    table = flag_table(Knobs)
    assert list(table) == ["depth", "knob_ratio", "limit", "fast", "label"]  # field order; no `internal`
    depth = table["depth"][1]
    assert (depth.default, depth.min, depth.max, depth.envvar, depth.rich_help_panel, depth.help) == (
        2,
        1,
        8,
        "DYN_DEPTH",
        "Knobs",
        "How deep.",
    )
    assert table["knob_ratio"][1].min == 0.0 and table["knob_ratio"][0] == float | None
    assert (table["limit"][1].default, table["limit"][1].min) == (16, 0)
    assert table["fast"][1].envvar == "DYN_FAST" and table["label"][1].default == "x"
    assert [s.field for s in declared_flags(Knobs)] == ["depth", "ratio", "limit", "fast", "label"]


def _app():
    app, seen = typer.Typer(), {}

    @app.command()
    @config_flags("knobs", Knobs)
    def run(before: str = "b", knobs: Knobs = None, after: str = "a") -> None:
        seen["knobs"] = knobs

    return app, seen


def test_the_command_gets_one_validated_config_from_flags_and_env_twins():
    app, seen = _app()
    result = CliRunner().invoke(
        app, ["--depth", "3", "--limit", "0", "--no-fast"], env={"DYN_KNOB_RATIO": "0.5"}
    )
    assert result.exit_code == 0, result.output
    assert seen["knobs"] == Knobs(depth=3, ratio=0.5, limit=None, fast=False, label="x")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--depth", "9"], "--depth"),
        (["--knob-ratio", "-1"], "--knob-ratio"),
        (["--limit", "-1"], "--limit"),
        (["--label", "bad"], "--label must not be bad"),
    ],
)
def test_a_value_out_of_its_declared_range_or_refused_by_validate_exits_2(args, needle):
    app, seen = _app()
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2 and needle in result.output and "knobs" not in seen


def test_the_router_and_engine_flags_come_from_their_config_classes():
    from dyn.cli.router_flags import _FLAGS
    from dyn.core.router.config import KvRouterConfig
    from dyn.plugins.mocker.config import MockerConfig

    declared = {s.flag.param for s in declared_flags(KvRouterConfig)}
    assert declared <= set(_FLAGS) and len(declared) == 37  # 29 router flags, 8 --aic-*
    assert {s.flag.long_name for s in declared_flags(MockerConfig)} >= {
        "--num-gpu-blocks-override",
        "--reasoning",
    }


class Gauges(msgspec.Struct, kw_only=True, frozen=True):
    """A second config declaring ``--depth`` too (as the router and the mocker both declare the
    ``--aic-*`` flags)."""

    depth: Annotated[int, flag("--depth", help="How deep.")] = 2
    width: Annotated[int, flag("--width", help="How wide.")] = 1


def test_a_flag_two_configs_declare_is_offered_once_and_read_by_both():
    app, seen = typer.Typer(), {}

    @app.command()
    @config_flags("gauges", Gauges, reads=("depth",))
    @config_flags("knobs", Knobs)
    def run(knobs: Knobs = None, gauges: Gauges = None) -> None:
        seen.update(knobs=knobs, gauges=gauges)

    result = CliRunner().invoke(app, ["--depth", "5", "--width", "3"])
    assert result.exit_code == 0, result.output
    assert (seen["knobs"].depth, seen["gauges"]) == (5, Gauges(depth=5, width=3))
    names = [p.name for p in typer.main.get_command(app).params]
    assert names.count("depth") == 1 and "width" in names


def test_reading_a_flag_no_decorator_below_declared_is_a_type_error():
    def run(gauges: Gauges = None) -> None:
        pass

    with pytest.raises(TypeError, match="has no depth for gauges to read"):
        config_flags("gauges", Gauges, reads=("depth",))(run)
