"""Side-by-side comparison, release-gate thresholds, the HTML report (rendered in headless
Chromium when it is installed) and the ``compare`` / ``demo`` commands."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from tokenfair.evaluation.compare import compare_results, run_compare, run_demo
from tokenfair.evaluation.table import compare_table, table_rows
from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile
from tokenfair.evaluation.report import write_report
from tokenfair.workloads.scenarios import SCENARIOS
from tokenfair.evaluation.thresholds import (Check, ThresholdsError, evaluate, load_thresholds, parse_thresholds,
                                  verdict)
from tokenfair.workloads.workload import TraceRow, Workload, write_trace

PROFILE = Profile(name="tiny", kind="linear", prefill_batch_s=0.01, prefill_token_s=0.0005,
                  decode_base_s=0.01, decode_seq_s=0.0002, overhead_s=0.0,
                  kv_capacity_tokens=3072, block_size=16)
CONTRACT = parse_contract({
    "version": "test-1",
    "tenants": {"big": {"weight": 1}, "small": {"weight": 1}},
    "classes": {"interactive": {"priority": 20, "max_wait_s": 5, "ttft_slo_s": 2.0},
                "batch": {"priority": 0, "max_wait_s": 60}},
    "default_class": "interactive",
    "engine": {"prefill_token_budget": 512, "decode_token_budget": 64, "chunk_size": 512, "max_running": 16},
})


def small_workload(name: str = "tiny", seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(90):
        t = float(rng.uniform(0, 6))
        if i % 3:
            rows.append((t, "big", int(rng.integers(200, 900)), int(rng.integers(20, 120)), "batch"))
        else:
            rows.append((t, "small", int(rng.integers(20, 200)), int(rng.integers(10, 80)), "interactive"))
    rows.sort()
    return Workload(name, tuple(TraceRow(f"{name}-{i:03d}", round(t, 4), ten, p, o, klass=k)
                                for i, (t, ten, p, o, k) in enumerate(rows)))


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    notes: list[str] = []
    summaries = run_compare(small_workload(), CONTRACT, PROFILE, ["fifo", "no-such-policy", "vtc", "fifo"], out,
                            progress=notes.append)
    return out, summaries, notes


# -- thresholds --------------------------------------------------------------------------------
GATE = {
    "version": "t1",
    "default": {"min_jain": 0.9, "max_share_deviation": 0.1, "max_starvation_events": 0,
                "min_throughput_ratio_vs_fifo": 0.9,
                "tenants": {"*": {"max_ttft_p99_s": 5.0}}, "classes": {"interactive": {"max_tpot_p99_s": 0.1}}},
    "scenarios": {"w": {"max_starvation_events": 3, "min_jain": None,
                        "tenants": {"a": {"max_ttft_p99_s": 1.0, "max_tpot_p99_s": 0.05}}}},
}


def fake_summary(workload="x", jain=0.95, dev=0.05, starve=0, tput=100.0, ttft_a=2.0, ttft_b=None):
    lat = lambda v: {"p50": v, "p95": v, "p99": v, "max": v}  # noqa: E731
    return {"workload": workload, "fairness": {"jain_min": jain, "max_abs_share_deviation": dev},
            "starvation_events": starve, "throughput_tokens_per_s": tput,
            "tenants": {"a": {"ttft_s": lat(ttft_a), "tpot_s": lat(0.04)}, "b": {"ttft_s": lat(ttft_b), "tpot_s": lat(None)}},
            "classes": {"interactive": {"ttft_s": lat(1.0), "tpot_s": lat(0.2)}}}


def test_group_starvation_and_class_share_checks():
    t = parse_thresholds({"default": {"min_class_share_ratio": 0.9,
                                      "tenants": {"*": {"max_starvation_events": 0}, "b": {"max_starvation_events": None}}}})
    s = fake_summary()
    s["tenants"]["a"]["starvation_events"] = 2
    s["tenants"]["b"]["starvation_events"] = 50
    s["fairness"]["class_min_share"] = {"batch": {"ratio_to_min_share": 0.5}, "gold": {"ratio_to_min_share": 1.2}}
    checks = {c.name: c for c in evaluate(s, t)}
    assert not checks["tenant[a].starvation_events"].passed and "tenant[b].starvation_events" not in checks
    assert not checks["class[batch].share_vs_min_share"].passed and checks["class[gold].share_vs_min_share"].passed


def test_default_thresholds_file_loads_and_covers_the_scenarios():
    t = load_thresholds()
    assert t.version and t.default.min_jain is not None
    for s in SCENARIOS:
        assert t.for_workload(s).min_throughput_ratio_vs_fifo is not None


def test_thresholds_errors_name_the_path(tmp_path):
    bad = {"default": {"min_jian": 0.9, "tenants": {"chat": {"max_ttft_p99_s": -1}}}, "scenarios": {"hol": {"min_jain": 2}}}
    with pytest.raises(ThresholdsError) as err:
        parse_thresholds(bad, "gate.yaml")
    msg = str(err.value)
    assert "gate.yaml: default.min_jian: unknown field" in msg
    assert "default.tenants.chat.max_ttft_p99_s: must be > 0" in msg
    assert "scenarios.hol.min_jain" in msg
    with pytest.raises(ThresholdsError, match="cannot read"):
        load_thresholds(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ThresholdsError, match="mapping"):
        load_thresholds(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("default: {min_jain: [\n")
    with pytest.raises(ThresholdsError, match="not valid YAML"):
        load_thresholds(tmp_path / "bad.yaml")
    # a limit is a finite number (one that should not apply is left out)
    with pytest.raises(ThresholdsError, match="default.max_longest_service_gap_s: Input should be a finite number"):
        parse_thresholds({"default": {"max_longest_service_gap_s": float("inf")}}, "gate.yaml")


def test_evaluate_checks_and_overrides():
    t = parse_thresholds(GATE)
    checks = {c.name: c for c in evaluate(fake_summary(), t, fake_summary(tput=100.0))}
    assert set(checks) == {"jain_min", "max_abs_share_deviation", "starvation_events", "throughput_ratio_vs_fifo",
                           "tenant[a].ttft_p99_s", "tenant[b].ttft_p99_s", "class[interactive].tpot_p99_s"}
    assert checks["jain_min"].passed and checks["jain_min"].op == ">="
    assert checks["throughput_ratio_vs_fifo"].value == 1.0 and checks["throughput_ratio_vs_fifo"].passed
    assert checks["tenant[a].ttft_p99_s"].passed
    assert not checks["tenant[b].ttft_p99_s"].passed            # nothing served: fails
    assert not checks["class[interactive].tpot_p99_s"].passed   # 0.2 > 0.1
    assert not verdict(list(checks.values()))
    # no baseline: no throughput check; a metric that does not apply (jain None) passes
    names = [c.name for c in evaluate(fake_summary(jain=None), t)]
    assert "throughput_ratio_vs_fifo" not in names
    assert next(c for c in evaluate(fake_summary(jain=None), t) if c.name == "jain_min").passed
    low = {c.name: c for c in evaluate(fake_summary(tput=80), t, fake_summary(tput=100))}
    assert low["throughput_ratio_vs_fifo"].value == pytest.approx(0.8) and not low["throughput_ratio_vs_fifo"].passed
    # workload "w": starvation limit raised, Jain check off, tenant a overridden field-wise
    w = {c.name: c for c in evaluate(fake_summary(workload="w", starve=2, ttft_a=2.0), t)}
    assert "jain_min" not in w and w["starvation_events"].passed and w["starvation_events"].limit == 3
    assert w["tenant[a].ttft_p99_s"].limit == 1.0 and not w["tenant[a].ttft_p99_s"].passed
    assert w["tenant[a].tpot_p99_s"].passed and w["tenant[b].ttft_p99_s"].limit == 5.0
    assert Check("x", 1.0, 2.0, True).as_dict()["op"] == "<="


# -- comparison ---------------------------------------------------------------------------------
def test_run_compare_writes_every_policy_and_skips_unknown(compared):
    out, summaries, notes = compared
    assert list(summaries) == ["fifo", "vtc"]
    assert any("no-such-policy" in n and "skipping" in n for n in notes)
    for p in summaries:
        for f in ("requests.jsonl", "summary.json", "timeline.json"):
            assert (out / p / f).is_file()
        s = json.loads((out / p / "summary.json").read_text())
        assert s["policy"] == p and s["workload"] == "tiny" and isinstance(s["gate"]["passed"], bool)
        assert any(c["name"] == "throughput_ratio_vs_fifo" for c in s["gate"]["checks"])
        assert len((out / p / "requests.jsonl").read_text().splitlines()) == 90
    assert (out / "report.html").is_file()


def test_compare_table_one_row_per_policy(compared):
    _, summaries, _ = compared
    text = compare_table(summaries)
    lines = text.splitlines()
    assert len(lines) == 2 + len(summaries)
    for col in ("tok/s", "jain min", "starve", "worst P99 TTFT", "max slowdn", "preempt", "recov %", "verdict"):
        assert col in lines[0]
    rows = table_rows(summaries)
    assert [r["policy"] for r in rows] == ["fifo", "vtc"]
    for r, line in zip(rows, lines[2:]):
        assert line.startswith(r["policy"]) and line.rstrip().endswith(r["verdict"])
        assert r["verdict"] in ("pass", "fail") and r["worst_tenant"] in ("big", "small")


# -- the report -----------------------------------------------------------------------------------
def test_report_is_self_contained_with_plots_and_gate(compared, tmp_path):
    out, _, _ = compared
    html = (out / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert "http://" not in html and "https://" not in html and "<script" not in html.lower()
    imgs = re.findall(r'<img[^>]+src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(imgs) >= 4                       # shares, CDFs, slowdown, queue/KV (+ preemptions)
    assert all(len(b) > 2000 for b in imgs)
    assert "Release gate" in html and ("PASS" in html or "FAIL" in html)
    for heading in ("Side by side", "Token share per tenant", "TTFT and TPOT", "Slowdown per", "Queue length",
                    "Preemption timeline"):
        assert heading in html
    assert html.count("class=how") >= 6


def test_write_report_multi_scenario_and_many_tenants(tmp_path):
    """Two scenarios in one file; > 8 tenants switches the CDFs to classes."""
    rows = tuple(TraceRow(f"m{i:03d}", 0.05 * i, f"t{i % 11:02d}", 100 + 10 * (i % 7), 20 + (i % 5),
                          klass="batch" if i % 2 else "interactive") for i in range(66))
    many = Workload("many", rows)
    runs_a = compare_results(many, CONTRACT, PROFILE, ["fifo"], None, progress=None, isolated=False)
    runs_b = compare_results(small_workload("other", 1), CONTRACT, PROFILE, ["vtc"], None, progress=None, isolated=False)
    for r in runs_b.values():              # verdict evaluated by the report itself
        r["summary"].pop("gate")
        r.pop("contract")
    p = write_report(tmp_path / "r.html", {"many": runs_a, "other": runs_b})
    html = p.read_text()
    assert "id='s-many'" in html and "id='s-other'" in html and "<nav>" in html
    assert "per class (more than 8 tenants)" in html
    assert html.count("<img") >= 8


def _chromium() -> str | None:
    for c in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or ""):
        if c and Path(c).exists():
            return c
    return None


def _chromium_args(exe: str, profile_dir: Path) -> list[str]:
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile_dir}"]


def test_report_renders_in_headless_chromium(compared, tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium is not installed (/usr/bin/chromium); the test-setup script installs it with "
                    "`apt-get install -y chromium`")
    from matplotlib.image import imread
    out, _, _ = compared
    url = (out / "report.html").resolve().as_uri()
    shot = tmp_path / "shot.png"
    subprocess.run(_chromium_args(exe, tmp_path / "prof1") + [f"--screenshot={shot}", "--window-size=1400,3000", url],
                   capture_output=True, timeout=90, check=False)
    assert shot.is_file() and shot.stat().st_size > 10_000
    img = imread(str(shot))
    assert img.shape[0] >= 2900 and img.shape[1] >= 1300
    rgb = (img[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    colours = np.unique(rgb[:: 7], axis=0)
    assert len(colours) > 200, f"screenshot looks blank: {len(colours)} colours"
    # the plots area (below the tables) is not blank either
    lower = (img[1500:, :, :3] * 255).astype(np.uint8).reshape(-1, 3)
    assert len(np.unique(lower[:: 7], axis=0)) > 100
    dom = subprocess.run(_chromium_args(exe, tmp_path / "prof2") + ["--dump-dom", url],
                         capture_output=True, text=True, timeout=90, check=False).stdout
    assert "Release gate" in dom
    assert len(re.findall(r"<img[^>]+data:image/png;base64", dom)) >= 4


# -- CLI --------------------------------------------------------------------------------------
@pytest.fixture()
def cli_app():
    from tokenfair.cli.compare import compare, demo
    app = typer.Typer(add_completion=False)
    app.command("compare")(compare)
    app.command("demo")(demo)
    return app


def _trace(tmp_path: Path) -> Path:
    p = tmp_path / "trace.jsonl"
    write_trace(small_workload().rows[:40], p)
    return p


def _profile_file(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.yaml"
    p.write_text("\n".join(f"{k}: {v}" for k, v in PROFILE.model_dump().items()) + "\n")
    return p


def test_cli_compare_user_errors_exit_2(cli_app, tmp_path):
    r = CliRunner()
    trace, prof = _trace(tmp_path), _profile_file(tmp_path)
    base = ["compare", str(trace), "--out", str(tmp_path / "o"), "--profile", str(prof)]
    cases = {
        "unknown policy": base + ["--policies", "fifo,nope"],
        "empty policies": base + ["--policies", " , "],
        "duplicate": base + ["--policies", "fifo,fifo"],
        "bad policy option": base + ["--policies", "fifo,vtc:bogus=1"],
        "bad option value": base + ["--policies", "vtc:output_weight=-1"],
        "missing trace": ["compare", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")],
        "bad profile": ["compare", str(trace), "--out", str(tmp_path / "o"), "--profile", "nosuch"],
        "bad contract": base + ["--contract", str(tmp_path / "none.yaml")],
        "bad thresholds": base + ["--thresholds", str(tmp_path / "gate.yaml")],
    }
    (tmp_path / "gate.yaml").write_text("default: {min_jain: 3}\n")
    for what, args in cases.items():
        res = r.invoke(cli_app, args)
        assert res.exit_code == 2, (what, res.output)
    res = r.invoke(cli_app, base + ["--thresholds", str(tmp_path / "gate.yaml")])
    assert "default.min_jain" in res.output
    res = r.invoke(cli_app, base + ["--policies", "fifo,nope"])
    assert "unknown policy 'nope'" in res.output


def test_cli_compare_runs(cli_app, tmp_path):
    trace, prof = _trace(tmp_path), _profile_file(tmp_path)
    (tmp_path / "gate.yaml").write_text("default: {min_jain: 0.5}\n")
    res = CliRunner().invoke(cli_app, ["compare", str(trace), "--policies", "fifo,sjf,vtc:input_weight=1,output_weight=3",
                                       "--out", str(tmp_path / "o"),
                                       "--profile", str(prof), "--thresholds", str(tmp_path / "gate.yaml")])
    assert res.exit_code == 0, res.output
    assert "sjf" in res.output and "verdict" in res.output
    assert (tmp_path / "o" / "sjf" / "summary.json").is_file() and (tmp_path / "o" / "report.html").is_file()
    s = json.loads((tmp_path / "o" / "vtc:input_weight=1,output_weight=3" / "summary.json").read_text())
    assert s["policy"] == "vtc:input_weight=1,output_weight=3"


def test_demo_covers_every_scenario(cli_app, tmp_path, monkeypatch):
    import tokenfair.cli.compare as cc
    import tokenfair.workloads.scenarios as sc

    def tiny_scenario(name, seed=0):
        return small_workload(name, seed), CONTRACT
    monkeypatch.setattr(sc, "SCENARIOS", ("one", "two"))
    monkeypatch.setattr(sc, "build_scenario", tiny_scenario)
    monkeypatch.setattr(cc, "DEFAULT_POLICIES", ("fifo", "priority", "not-registered"))
    out = tmp_path / "demo"
    res = CliRunner().invoke(cli_app, ["demo", "--out", str(out), "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert "not-registered" in res.output and "skipping" in res.output
    for s in ("one", "two"):
        assert (out / s / "report.html").is_file()
        for p in ("fifo", "priority"):
            assert (out / s / p / "summary.json").is_file()
    html = (out / "report.html").read_text()
    assert "Scenario: one" in html and "Scenario: two" in html and html.count("Release gate") == 2
    # the direct API returns {scenario: {policy: summary}}
    res2 = run_demo(tmp_path / "d2", 0, ["fifo"], scenarios=["one"], profile=PROFILE, progress=None)
    assert list(res2) == ["one"] and list(res2["one"]) == ["fifo"]


def test_gate_on_in_time_goodput_gaps_overdue_and_same_horizon_throughput():
    t = parse_thresholds({"default": {"min_throughput_ratio_vs_fifo": 0.9, "min_in_time_goodput_ratio_vs_fifo": 1.0,
                                      "max_longest_service_gap_s": 30.0, "max_overdue_within_share": 0}})
    base = fake_summary(tput=100.0) | {"goodput": {"in_time_tokens": 1000}, "finished_tokens": 5000}
    # a policy that rejected work: higher tokens/s of its own makespan, fewer finished tokens
    s = fake_summary(tput=130.0) | {"goodput": {"in_time_tokens": 900}, "finished_tokens": 4000,
                                    "vs_fifo": {"ratio": 0.8}, "longest_service_gap_s": 31.0,
                                    "overdue_within_share": 2}
    checks = {c.name: c for c in evaluate(s, t, base)}
    assert checks["throughput_ratio_vs_fifo"].value == 0.8 and not checks["throughput_ratio_vs_fifo"].passed
    assert checks["in_time_goodput_ratio_vs_fifo"].value == 0.9 and not checks["in_time_goodput_ratio_vs_fifo"].passed
    assert not checks["longest_service_gap_s"].passed and not checks["overdue_within_share"].passed
    # without vs_fifo (a summary compare did not write) the finished tokens of the whole runs count
    del s["vs_fifo"]
    assert {c.name: c for c in evaluate(s, t, base)}["throughput_ratio_vs_fifo"].value == 0.8


def test_a_comparison_computes_the_isolated_baselines_once(monkeypatch):
    """The isolated baselines do not depend on the policy (sim/simulate.py): a comparison
    computes them once and every policy's summary carries what a run of its own computes."""
    from tokenfair.sim import simulate as sim_module
    calls: list[str] = []
    real = sim_module.isolated_baselines

    def counting(workload, *args, **kwargs):
        calls.append(workload.name)
        return real(workload, *args, **kwargs)
    monkeypatch.setattr(sim_module, "isolated_baselines", counting)
    wl = small_workload()
    runs = compare_results(wl, CONTRACT, PROFILE, ["fifo", "vtc", "fair"], None, progress=lambda _: None)
    assert calls == ["tiny"]
    monkeypatch.setattr(sim_module, "isolated_baselines", real)
    alone = sim_module.simulate(wl, "fair", CONTRACT, PROFILE).summary
    for name, run in runs.items():
        assert {t: m.get("isolated") for t, m in run["summary"]["tenants"].items()} == \
            {t: m.get("isolated") for t, m in alone["tenants"].items()}, name
        assert run["summary"]["tenants"]["small"]["slowdown"] is not None
    assert runs["fair"]["summary"]["tenants"] == alone["tenants"]
