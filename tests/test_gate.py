"""``tokenfair gate``: both contracts on the same trace, side by side, exit 0 / 1 / 2."""

from __future__ import annotations

import json

import pytest
from heavy_light import write_heavy_light_trace
from typer.testing import CliRunner

from tokenfair.cli.app import app
from tokenfair.contracts.gate import Row, compare_rows, lookup, regression_check
from tokenfair.evaluation.thresholds import RegressionLimit, load_thresholds, parse_thresholds

BASE = "version: a1\ntenants:\n  heavy: {weight: 1}\n  light: {weight: 1}\n"
# modest re-weighting: the light tenant is still served at once
OK = "version: b-ok\ntenants:\n  heavy: {weight: 1.5}\n  light: {weight: 1}\n"
# the light tenant is throttled to a trickle and nothing is shed: its requests starve
STARVE = ("version: b-starve\ntenants:\n  heavy: {weight: 1, min_share: 0.9}\n"
          "  light: {weight: 1, max_concurrency: 1, rate_limit: {tokens_per_s: 20, burst_tokens: 400}}\n"
          "admission: {shed_over_max_wait: false}\n")


@pytest.fixture()
def files(tmp_path):
    out = {"trace": write_heavy_light_trace(tmp_path / "mixed.jsonl", 120, 30)}
    for name, text in (("base", BASE), ("ok", OK), ("starve", STARVE)):
        out[name] = tmp_path / f"{name}.yaml"
        out[name].write_text(text)
    return out


def test_gate_passes_a_fair_candidate_and_fails_one_that_starves(files, tmp_path):
    r = CliRunner()
    res = r.invoke(app, ["gate", str(files["trace"]), "--baseline", str(files["base"]), "--candidate",
                         str(files["ok"]), "--out", str(tmp_path / "ok")])
    assert res.exit_code == 0, res.output
    assert "gate PASS: b-ok@" in res.output and "tenant[light].ttft_p99_s" in res.output
    doc = json.loads((tmp_path / "ok" / "gate.json").read_text())
    assert doc["passed"] and doc["traces"][0]["checks"]
    assert (tmp_path / "ok" / "mixed" / "candidate" / "summary.json").exists()
    assert "b-ok" in (tmp_path / "ok" / "gate.html").read_text()

    res = r.invoke(app, ["gate", str(files["trace"]), "--baseline", str(files["base"]), "--candidate",
                         str(files["starve"]), "--out", str(tmp_path / "bad")])
    assert res.exit_code == 1, res.output
    last = res.output.strip().splitlines()[-2]
    assert last.startswith("gate FAIL: b-starve@")
    # each breach is named, the starved tenant's among them
    assert "tenant[light].starvation_events vs baseline" in last and "tenant[light].ttft_p99_s vs baseline" in last
    assert "BREACH starvation_events" in res.output
    html = (tmp_path / "bad" / "gate.html").read_text()
    assert "class=fail" in html and "FAIL" in html


def test_gate_bad_input_exits_2(files, tmp_path):
    r = CliRunner()
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: x\ntenants: {a: {weight: 0}}\n")
    res = r.invoke(app, ["gate", str(files["trace"]), "--baseline", str(files["base"]), "--candidate", str(bad),
                         "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "tenants.a.weight" in res.output
    th = tmp_path / "th.yaml"
    th.write_text("default: {max_regression: {ttft_p99_s: {max_ratio: 0.5}}}\n")
    res = r.invoke(app, ["gate", str(files["trace"]), "--baseline", str(files["base"]), "--candidate",
                         str(files["ok"]), "--out", str(tmp_path / "o"), "--thresholds", str(th)])
    assert res.exit_code == 2 and "max_ratio" in res.output
    res = r.invoke(app, ["gate", str(tmp_path / "nope.csv"), "--baseline", str(files["base"]), "--candidate",
                         str(files["ok"]), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "nope.csv" in res.output


def test_compared_metrics_come_from_the_thresholds_file():
    base = {"tenants": {"a": {"ttft_s": {"p99": 2.0}, "status": {"finished": 3}}}, "classes": {},
            "fairness": {"share_deviation": {"a": {"max_abs": 0.1}}}}
    cand = {"tenants": {"a": {"ttft_s": {"p99": 2.5}, "status": {"finished": 2, "rejected": 1},
                              "longest_gap_s": 4.0}}, "classes": {}, "fairness": {}}
    th = parse_thresholds({"compare": {"groups": {
        "ttft_p99_s": {"path": "ttft_s.p99"},
        "rejected": {"path": "status.rejected", "missing": 0},
        "gap": {"path": "longest_gap_s"},                      # a metric only the candidate has
        "dev": {"path": "/fairness.share_deviation.{name}.max_abs", "scopes": ["tenant"]}}}})
    rows = {r.metric: r for r in compare_rows(base, cand, th)}
    assert (rows["ttft_p99_s"].baseline, rows["ttft_p99_s"].candidate) == (2.0, 2.5)
    assert (rows["rejected"].baseline, rows["rejected"].candidate) == (0.0, 1.0)
    assert rows["gap"].baseline is None and rows["gap"].candidate == 4.0 and rows["gap"].delta is None
    assert rows["dev"].baseline == 0.1 and rows["dev"].candidate is None
    # not measured on one side: no regression check at all (it can neither pass nor fail)
    assert regression_check(rows["gap"], RegressionLimit(max_ratio=1.0)) is None
    lower = regression_check(rows["ttft_p99_s"], RegressionLimit(max_ratio=1.2, slack=0.05))
    assert lower.limit == pytest.approx(2.45) and not lower.passed
    higher = regression_check(Row("global", "", "tput", "higher", 100.0, 95.0), RegressionLimit(max_ratio=1.1))
    assert higher.op == ">=" and higher.passed and higher.limit == pytest.approx(100 / 1.1)
    assert lookup({"a": {"b": True}}, "a.b") is None and lookup({"a": {"b": 3}}, "a.b") == 3.0
    # the packaged thresholds carry the catalogue and the default regression limits
    packaged = load_thresholds()
    assert "ttft_p99_s" in packaged.compare.groups and "starvation_events" in packaged.default.max_regression


def test_gate_reads_a_service_records_file(files, tmp_path):
    """A serve/gateway records file is a trace: the gate replays it under both contracts."""
    recs = []
    for line in files["trace"].read_text().splitlines():
        r = json.loads(line)
        recs.append({**r, "class": "interactive", "status": "finished", "scheduled_s": r["arrival_s"],
                     "first_token_s": r["arrival_s"] + 0.1, "finish_s": r["arrival_s"] + 1.0,
                     "max_tokens": r["output_tokens"], "deadline_s": None, "mode": "gateway", "http_status": 200,
                     "contract_version": "a1", "arrival_s": 100.0 + r["arrival_s"]})
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = CliRunner().invoke(app, ["gate", str(path), "--baseline", str(files["base"]), "--candidate",
                                   str(files["starve"]), "--out", str(tmp_path / "rec")])
    assert res.exit_code == 1 and "tenant[light].overdue_requests vs baseline" in res.output
    summary = json.loads((tmp_path / "rec" / "records" / "baseline" / "summary.json").read_text())
    assert summary["requests"] == len(recs) and summary["workload"] == "records"
