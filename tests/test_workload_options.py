"""cli/workload_options + cli/options.options_in_place: the shaping options declared once reach
a command as one ShapingOptions, listed in the place of its ``shaping`` parameter (simulate and
compare take them so)."""

import dataclasses
from pathlib import Path

import typer
from typer.testing import CliRunner

from tokenfair.cli.app import app
from tokenfair.cli.options import options_in_place
from tokenfair.cli.workload_options import ShapingOptions


def _app(seen: list) -> typer.Typer:
    t = typer.Typer()

    @t.command()
    @options_in_place
    def cmd(name: str = typer.Argument(...), shaping: ShapingOptions = ShapingOptions(),
            last: int = typer.Option(0)) -> None:
        seen.append((name, shaping, last))
    return t


def test_options_reach_the_command_as_one_object(tmp_path: Path) -> None:
    seen: list = []
    mapping = tmp_path / "m.yaml"
    res = CliRunner().invoke(_app(seen), ["x", "--start-s", "1.5", "--max-requests", "7", "--skip-bad-rows",
                                          "--remap-tenants", str(mapping), "--last", "3"])
    assert res.exit_code == 0, res.output
    assert seen == [("x", ShapingOptions(skip_bad_rows=True, start_s=1.5, max_requests=7, remap_tenants=mapping), 3)]
    seen.clear()
    assert CliRunner().invoke(_app(seen), ["y"]).exit_code == 0
    assert seen == [("y", ShapingOptions(), 0)]
    res = CliRunner().invoke(_app(seen), ["y", "--spread-tenants", "0"])
    assert res.exit_code == 2 and len(seen) == 1          # min=1 holds, the command did not run


def test_simulate_and_compare_take_the_options_in_place() -> None:
    group = typer.main.get_command(app)
    shaping = [f.name for f in dataclasses.fields(ShapingOptions)]
    for command, before, after in (("simulate", "isolated", "replicas"), ("compare", "thresholds", None)):
        params = [p.name for p in group.commands[command].params]      # the --help order
        i = params.index(before) + 1
        assert params[i:i + len(shaping)] == shaping, params
        assert params[i + len(shaping):i + len(shaping) + 1] == ([after] if after else [])   # None: last
