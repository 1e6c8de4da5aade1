"""One self-contained HTML report comparing policies, per scenario: table, release gate, plots.

``write_report(path, {scenario: {policy: {"summary", "records", "timeline"[, "contract",
"checks"]}}})`` writes a single HTML file: CSS inline, every figure a base64 PNG rendered by
matplotlib's Agg backend, no scripts and no external URL -- it opens offline and can be
archived as the release-gate record.  ``contract`` (a :class:`~tokenfair.contracts.contract.Contract`)
gives the tenants' weights and min shares for the entitled-share curves (equal weights
without it); ``checks`` (a list of :class:`~tokenfair.evaluation.thresholds.Check` or their dicts)
overrides the verdict, which is otherwise read from ``summary["gate"]`` or evaluated against
the default thresholds with the ``fifo`` run (when present) as the throughput baseline.

Plot cost is bounded: CDF lines are subsampled to at most 256 points, at most 8 tenant (or
class) groups are drawn, and each figure is closed as soon as it is encoded.
"""

from __future__ import annotations

import html
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .report_plots import (
    CDF_POINTS,
    DPI,
    MAX_GROUPS,
    SMOOTH_S,
    fig_latency,
    fig_preemptions,
    fig_queue_kv,
    fig_shares,
    fig_slowdown,
)
from .table import table_rows
from .thresholds import Check, evaluate, load_thresholds

# The figures live in report_plots; its constants are re-exported here.
__all__ = [
    "MAX_GROUPS", "SMOOTH_S", "CDF_POINTS", "DPI", "scenario_anchor", "render_section", "render_document",
    "write_html", "write_report",
]

_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1f3a5f;color:#fff;padding:18px 32px}
header h1{margin:0 0 4px 0;font-size:24px}
header p{margin:0;opacity:.85}
main{max-width:1500px;margin:0 auto;padding:8px 32px 40px}
nav{margin:16px 0;padding:10px 14px;background:#fff;border:1px solid #dde2ea;border-radius:6px}
nav a{margin-right:16px;color:#1f3a5f;font-weight:600}
section.scenario{background:#fff;border:1px solid #dde2ea;border-radius:6px;padding:6px 22px 18px;margin:22px 0}
h2{border-bottom:2px solid #1f3a5f;padding-bottom:4px}
h3{margin-top:26px;margin-bottom:4px}
p.how{color:#4a5568;margin:2px 0 8px;font-size:14px}
p.meta{color:#4a5568;font-size:14px}
table{border-collapse:collapse;font-size:14px;margin:8px 0}
th,td{border:1px solid #d5dbe5;padding:4px 9px;text-align:right}
th{background:#eef2f7}
td.l,th.l{text-align:left}
.pass{color:#1b7f3b;font-weight:700}
.fail{color:#b42318;font-weight:700}
span.badge{display:inline-block;padding:1px 9px;border-radius:10px;color:#fff;font-size:13px}
span.badge.pass{background:#1b7f3b}
span.badge.fail{background:#b42318}
div.gate{display:flex;flex-wrap:wrap;gap:14px}
div.gate>div{border:1px solid #dde2ea;border-radius:6px;padding:4px 12px}
img.plot{max-width:100%;border:1px solid #e6e9ef;border-radius:4px;background:#fff}
footer{color:#6b7280;font-size:13px;text-align:center;padding:20px}
"""


# -- small helpers ------------------------------------------------------------------------
def _esc(v) -> str:
    return html.escape(str(v), quote=True)


def _fmt(v, fmt="{:.3g}") -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and not np.isfinite(v):
        return "–"
    return fmt.format(v)


def _checks_for(policy: str, run: dict, runs: dict) -> list[dict]:
    if "checks" in run:
        return [c.as_dict() if isinstance(c, Check) else dict(c) for c in run["checks"]]
    gate = run["summary"].get("gate")
    if gate is not None:
        return list(gate["checks"])
    base = runs.get("fifo", {}).get("summary")
    return [c.as_dict() for c in evaluate(run["summary"], load_thresholds(), base)]


def _group_key(runs: dict) -> str:
    tenants = set()
    for run in runs.values():
        tenants.update(run["summary"].get("tenants", {}))
    return "tenant" if len(tenants) <= MAX_GROUPS else "class"


def _top_groups(runs: dict, key: str) -> list[str]:
    counts: dict[str, int] = {}
    first = next(iter(runs.values()))
    for rec in first["records"]:
        counts[rec[key]] = counts.get(rec[key], 0) + 1
    return sorted(counts, key=lambda g: (-counts[g], g))[:MAX_GROUPS]


# -- HTML --------------------------------------------------------------------------------
def _table_html(runs: dict, verdicts: dict[str, bool]) -> str:
    rows = table_rows({p: r["summary"] for p, r in runs.items()}, verdicts)
    head = ("<tr><th class=l>policy</th><th>throughput (tok/s)</th><th>finished tokens</th>"
            "<th>in-time tokens</th><th>Jain min</th><th>starvation</th><th>longest gap (s)</th>"
            "<th class=l>worst tenant P99 TTFT (s)</th><th>max slowdown</th><th>preemptions</th>"
            "<th>recovery %</th><th>rejected</th><th class=l>not finished, by reason</th><th>verdict</th></tr>")
    body = []
    for r in rows:
        v = r["verdict"]
        cls = "pass" if v == "pass" else "fail" if v == "fail" else ""
        worst = "–" if r["worst_ttft_p99_s"] is None else f"{r['worst_ttft_p99_s']:.3g} ({_esc(r['worst_tenant'])})"
        body.append(f"<tr><td class=l><b>{_esc(r['policy'])}</b></td><td>{_fmt(r['throughput'], '{:,.0f}')}</td>"
                    f"<td>{_fmt(r['finished_tokens'], '{:,.0f}')}</td><td>{_fmt(r['in_time_tokens'], '{:,.0f}')}</td>"
                    f"<td>{_fmt(r['jain_min'], '{:.3f}')}</td><td>{r['starvation']}</td>"
                    f"<td>{_fmt(r['longest_gap_s'], '{:.1f}')}</td><td class=l>{worst}</td>"
                    f"<td>{_fmt(r['max_slowdown'], '{:.3g}')}</td><td>{r['preemptions']}</td>"
                    f"<td>{_fmt(r['recovery_pct'], '{:.2f}')}</td><td>{r['rejected']}</td>"
                    f"<td class=l>{_esc(r['rejected_by_reason'] or '–')}</td>"
                    f"<td class={cls}>{_esc(v)}</td></tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _gate_html(checks: dict[str, list[dict]]) -> str:
    blocks = []
    for pol, cs in checks.items():
        ok = all(c["passed"] for c in cs)
        rows = []
        for c in cs:
            val = "n/a" if c["value"] is None else _fmt(c["value"], "{:.4g}")
            rows.append(f"<tr><td class=l>{_esc(c['name'])}</td><td>{val}</td><td>{_esc(c['op'])} {_fmt(c['limit'], '{:.4g}')}</td>"
                        f"<td class={'pass' if c['passed'] else 'fail'}>{'PASS' if c['passed'] else 'FAIL'}</td></tr>")
        blocks.append(f"<div><h4>{_esc(pol)} <span class='badge {'pass' if ok else 'fail'}'>{'PASS' if ok else 'FAIL'}</span>"
                      f" <small>{sum(c['passed'] for c in cs)}/{len(cs)} checks</small></h4>"
                      f"<table><tr><th class=l>check</th><th>value</th><th>limit</th><th>result</th></tr>{''.join(rows)}</table></div>")
    return f"<div class=gate>{''.join(blocks)}</div>"


def scenario_anchor(name: str) -> str:
    return "s-" + "".join(ch if ch.isalnum() else "-" for ch in name)


def render_section(scenario: str, runs: dict[str, dict]) -> str:
    """The HTML ``<section>`` for one scenario (table, release gate, plots)."""
    if not runs:
        return f"<section class=scenario id='{scenario_anchor(scenario)}'><h2>{_esc(scenario)}</h2><p>no runs</p></section>"
    checks = {p: _checks_for(p, r, runs) for p, r in runs.items()}
    verdicts = {p: all(c["passed"] for c in cs) for p, cs in checks.items()}
    first = next(iter(runs.values()))["summary"]
    key = _group_key(runs)
    groups = _top_groups(runs, key)
    fig = Figure(layout="constrained")
    parts = [f"<section class=scenario id='{scenario_anchor(scenario)}'><h2>Scenario: {_esc(scenario)}</h2>",
             f"<p class=meta>workload <b>{_esc(first.get('workload', scenario))}</b> · {first.get('requests', 0)} requests · "
             f"{len(first.get('tenants', {}))} tenants · contract {_esc(first.get('contract_version', '?'))}"
             f"@{_esc(first.get('contract_hash', '?'))} · profile {_esc(first.get('profile', '?'))}</p>",
             "<h3>Side by side</h3>",
             "<p class=how>One row per policy on the same workload. Jain min: worst weighted Jain index over "
             "60 s windows with at least two tenants backlogged (1 = perfectly fair). Starvation: requests that "
             "waited longer than their class's max_wait_s. Recovery: share of work spent recomputing/swapping "
             "after preemptions.</p>",
             _table_html(runs, verdicts),
             "<h3>Release gate</h3>",
             "<p class=how>Every threshold check per policy; a policy passes the gate only if all its checks pass.</p>",
             _gate_html(checks)]
    parts += ["<h3>Token share per tenant over time</h3>",
              f"<p class=how>Solid: the tenant's share of cost-weighted token service over a trailing {SMOOTH_S:.0f} s "
              "window. Dashed (same colour): its entitled share among the tenants backlogged at that time "
              "(contract weights, water-filled to min shares); no dashed line where fewer than two tenants wait. "
              "Fair means solid follows dashed.</p>",
              fig_shares(runs, fig)]
    label = "tenant" if key == "tenant" else "class (more than 8 tenants)"
    parts += [f"<h3>TTFT and TPOT distributions per {label}</h3>",
              "<p class=how>Cumulative distribution (log time axis): a curve further left is faster; a long flat "
              "tail on the right is a group kept waiting. Top row time to first token, bottom row time per "
              "output token.</p>",
              fig_latency(runs, key, groups, fig)]
    parts += [f"<h3>Slowdown per {key}</h3>",
              "<p class=how>End-to-end latency divided by the same request's latency alone on an empty engine "
              "(1 = no interference). Bars: median; black ticks: P99. Log scale.</p>",
              fig_slowdown(runs, key, groups, fig)]
    parts += ["<h3>Queue length and KV cache use</h3>",
              "<p class=how>Waiting requests and the fraction of KV blocks held at the end of each second. A queue "
              "that never drains means the workload overloads the engine; KV near 100% explains preemptions.</p>",
              fig_queue_kv(runs, fig)]
    pre = fig_preemptions(runs, fig)
    parts += ["<h3>Preemption timeline</h3>",
              "<p class=how>One tick per preempted request (KV shortage or an urgent request), per policy; the count "
              "is in brackets.</p>",
              pre if pre is not None else "<p><i>No policy preempted any request in this scenario.</i></p>"]
    parts.append("</section>")
    return "\n".join(parts)


def render_document(sections: list[tuple[str, str]], title: str = "tokenfair policy comparison") -> str:
    nav = "".join(f"<a href='#{scenario_anchor(n)}'>{_esc(n)}</a>" for n, _ in sections)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset='utf-8'>"
            f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>{_esc(title)}</h1><p>{len(sections)} scenario(s) · generated {stamp} · "
            "simulated runs; every figure is embedded, the file works offline</p></header><main>"
            + (f"<nav>Scenarios: {nav}</nav>" if len(sections) > 1 else "")
            + "\n".join(s for _, s in sections)
            + "</main><footer>tokenfair · release-gate report</footer></body></html>\n")


def write_html(path: str | Path, sections: list[tuple[str, str]], title: str = "tokenfair policy comparison") -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_document(sections, title), encoding="utf-8")
    return p


def write_report(path: str | Path, scenario_results: dict[str, dict[str, dict]],
                 title: str = "tokenfair policy comparison") -> Path:
    """Write one self-contained HTML report: scenario -> policy -> {summary, records, timeline}."""
    sections = [(name, render_section(name, runs)) for name, runs in scenario_results.items()]
    return write_html(path, sections, title)
