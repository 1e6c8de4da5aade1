"""``tokenfair sweep``: contract variants in worker processes, ranked by the gate."""

from __future__ import annotations

import json

import pytest
from heavy_light import write_heavy_light_trace
from typer.testing import CliRunner

from tokenfair.cli.app import app
from tokenfair.contracts.sweep import GridError, load_grid


@pytest.fixture()
def setup(tmp_path):
    write_heavy_light_trace(tmp_path / "t.jsonl", 80, 20)
    (tmp_path / "base.yaml").write_text("version: s1\ntenants:\n  heavy: {weight: 1}\n  light: {weight: 1}\n"
                                        "admission: {shed_over_max_wait: false}\n")
    # light's token rate: 1e6 leaves it alone, 20/s starves it
    (tmp_path / "grid.yaml").write_text("base: base.yaml\nvary:\n  tenants.heavy.weight: [1, 2]\n"
                                        "  tenants.light.rate_limit: [{tokens_per_s: 1000000, burst_tokens: 1000000},"
                                        " {tokens_per_s: 20, burst_tokens: 400}]\n")
    return tmp_path


def test_sweep_ranks_variants_by_the_gate(setup):
    from tokenfair.core.costmodel import load_profile
    load_profile(None).cost          # a used profile caches its compiled cost object: must not reach a worker
    res = CliRunner().invoke(app, ["sweep", str(setup / "t.jsonl"), "--grid", str(setup / "grid.yaml"),
                                   "--out", str(setup / "out"), "--workers", "2"])
    assert res.exit_code == 0, res.output
    doc = json.loads((setup / "out" / "sweep.json").read_text())
    assert doc["light_tenants"] == ["light"]        # the smaller tenant, found from the trace
    ranked = doc["variants"]
    assert [v["rank"] for v in ranked] == [1, 2, 3, 4] and len({v["variant"] for v in ranked}) == 4
    starving = {v["variant"] for v in ranked if v["set:tenants.light.rate_limit"]["tokens_per_s"] == 20}
    assert starving == {2, 4}
    # every variant that leaves light alone passes and ranks above every one that starves it
    assert [v["passed"] for v in ranked] == [True, True, False, False]
    assert {v["variant"] for v in ranked[2:]} == starving
    assert any("tenant[light].starvation_events" in b for b in ranked[-1]["breached"])
    assert ranked[0]["light_ttft_p99_s"] < ranked[-1]["light_ttft_p99_s"]
    assert (setup / "out" / "sweep.png").stat().st_size > 1000 and (setup / "out" / "sweep.csv").exists()
    assert (setup / "out" / "variants" / "s1-sweep4.yaml").exists()
    assert "rank" in res.output and "s1-sweep1" in res.output


def test_bad_grid_is_an_error(setup):
    g = setup / "bad.yaml"
    g.write_text("base: base.yaml\nvary:\n  tenants.light.weight: [1, -2]\n")
    with pytest.raises(GridError, match="variant 2.*tenants.light.weight"):
        load_grid(g)
    g.write_text("base: base.yaml\nvary: {}\n")
    res = CliRunner().invoke(app, ["sweep", str(setup / "t.jsonl"), "--grid", str(g), "--out", str(setup / "o")])
    assert res.exit_code == 2 and "non-empty list" in res.output
    g.write_text("base: base.yaml\nvary:\n  tenants.light.weight: [1]\nextra: 1\n")
    with pytest.raises(GridError, match="unknown key"):
        load_grid(g)
    # a named light tenant that sends nothing (a typo) is refused before any variant runs
    g.write_text("base: base.yaml\nvary:\n  tenants.light.weight: [1, 2]\nlight_tenants: [lihgt]\n")
    res = CliRunner().invoke(app, ["sweep", str(setup / "t.jsonl"), "--grid", str(g), "--out", str(setup / "o")])
    assert res.exit_code == 2 and "light_tenants: 'lihgt' sends no request in the traces" in res.output
    assert not (setup / "o" / "sweep.json").exists()
