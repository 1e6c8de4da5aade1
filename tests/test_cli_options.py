"""cli/options.py: a typer command whose options are one frozen dataclass (nested ones listed in
place), and the serve/gateway commands built with it."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import List, Optional

import pytest
import typer
from typer.testing import CliRunner

from tokenfair.cli.options import nested, option, options_command, parameters


@dataclass(frozen=True)
class Shared:
    level: int = option(3, "a shared level")
    name: Optional[str] = option(None, "a shared name")


@dataclass(frozen=True)
class Opts:
    items: List[str] = option(..., "an item (repeat)")
    shared: Shared = nested(Shared)
    mode: str = option("fast", "the mode", "--the-mode")
    flag: bool = option(False, "a flag")


def _app(seen: list) -> typer.Typer:
    @options_command(Opts)
    def cmd(opts: Opts) -> None:
        """Run the thing."""
        seen.append(opts)

    app = typer.Typer()
    app.command("cmd")(cmd)
    app.command("other")(lambda: None)
    return app


def test_values_arrive_as_one_frozen_object_with_nested_options():
    seen: list = []
    r = CliRunner().invoke(_app(seen), ["cmd", "--items", "a", "--items", "b", "--level", "5", "--the-mode", "slow",
                                        "--flag"])
    assert r.exit_code == 0, r.output
    assert seen == [Opts(items=["a", "b"], shared=Shared(level=5, name=None), mode="slow", flag=True)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[0].mode = "x"                                            # type: ignore[misc]
    r = CliRunner().invoke(_app(seen), ["cmd", "--items", "a", "--level", "many"])
    assert r.exit_code == 2 and "level" in r.output                  # typer's own check of the type
    r = CliRunner().invoke(_app(seen), ["cmd"])
    assert r.exit_code == 2 and "items" in r.output                  # required


def test_help_lists_the_fields_in_declaration_order_with_their_help():
    r = CliRunner().invoke(_app([]), ["cmd", "--help"], terminal_width=120)
    assert r.exit_code == 0 and "Run the thing." in r.output
    names = re.findall(r"--(items|level|name|the-mode|flag)\b", r.output)
    assert names == ["items", "level", "name", "the-mode", "flag"]
    assert "a shared level" in r.output and "[default: 3]" in r.output


def test_an_option_declared_twice_is_refused():
    @dataclass(frozen=True)
    class Twice:
        level: int = option(1, "again")
        shared: Shared = nested(Shared)

    with pytest.raises(TypeError, match="declared twice"):
        options_command(Twice)


def test_serve_and_gateway_declare_the_shared_options_once():
    from tokenfair.cli.serve import GatewayOptions, HttpOptions, ServeOptions, ServiceOptions

    shared = [p.name for p in parameters(ServiceOptions)] + [p.name for p in parameters(HttpOptions)]
    for cls in (ServeOptions, GatewayOptions):
        names = [p.name for p in parameters(cls)]
        assert set(shared) <= set(names) and len(names) == len(set(names))
    assert [p.name for p in parameters(GatewayOptions)][:2] == ["backend", "contract"]
