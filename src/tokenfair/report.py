"""One self-contained HTML report comparing policies, per scenario: table, release gate, plots.

``write_report(path, {scenario: {policy: {"summary", "records", "timeline"[, "contract",
"checks"]}}})`` writes a single HTML file: CSS inline, every figure a base64 PNG rendered by
matplotlib's Agg backend, no scripts and no external URL -- it opens offline and can be
archived as the release-gate record.  ``contract`` (a :class:`~tokenfair.contract.Contract`)
gives the tenants' weights and min shares for the entitled-share curves (equal weights
without it); ``checks`` (a list of :class:`~tokenfair.thresholds.Check` or their dicts)
overrides the verdict, which is otherwise read from ``summary["gate"]`` or evaluated against
the default thresholds with the ``fifo`` run (when present) as the throughput baseline.

Plot cost is bounded: CDF lines are subsampled to at most 256 points, at most 8 tenant (or
class) groups are drawn, and each figure is closed as soon as it is encoded.
"""

from __future__ import annotations

import base64
import html
import io
import time
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from .metrics import _backlog_buckets, entitled_shares
from .thresholds import Check, evaluate, load_thresholds

MAX_GROUPS = 8
SMOOTH_S = 10.0
CDF_POINTS = 256
DPI = 80

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


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buf, format="png", dpi=DPI)
    fig.clear()
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img class="plot" alt="plot" src="data:image/png;base64,{data}">'


def _series(d: dict, n: int) -> np.ndarray:
    out = np.zeros(n)
    for b, v in d.items():
        b = int(b)
        if 0 <= b < n:
            out[b] += v
    return out


def _last_value_series(d: dict, n: int) -> np.ndarray:
    """A per-bucket gauge (queue length, KV use), carried forward over buckets without steps."""
    out = np.full(n, np.nan)
    for b, v in d.items():
        b = int(b)
        if 0 <= b < n:
            out[b] = v
    for i in range(1, n):
        if np.isnan(out[i]):
            out[i] = out[i - 1]
    return np.nan_to_num(out)


def _trailing_sum(a: np.ndarray, w: int) -> np.ndarray:
    c = np.cumsum(np.concatenate([[0.0], a]))
    idx = np.arange(1, a.size + 1)
    return c[idx] - c[np.maximum(0, idx - w)]


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


def _legend(ax, **kw) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def _colors(names: list[str]) -> dict[str, str]:
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
               "#17becf", "#7f7f7f", "#bcbd22"]
    return {n: palette[i % len(palette)] for i, n in enumerate(names)}


# -- figures -----------------------------------------------------------------------------
def _fig_shares(runs: dict, fig: Figure) -> str:
    policies = list(runs)
    axes = fig.subplots(1, len(policies), sharey=True, squeeze=False)[0]
    fig.set_size_inches(3.4 * len(policies) + 0.6, 3.3)
    all_tenants: dict[str, float] = {}
    for run in runs.values():
        for t, s in run["timeline"]["tenant_service"].items():
            all_tenants[t] = all_tenants.get(t, 0.0) + sum(s.values())
    shown = sorted(all_tenants, key=lambda t: (-all_tenants[t], t))[:MAX_GROUPS - 1 if len(all_tenants) > MAX_GROUPS else MAX_GROUPS]
    other = len(all_tenants) > len(shown)
    colors = _colors(shown + (["other"] if other else []))
    for ax, pol in zip(axes, policies):
        run = runs[pol]
        tl = run["timeline"]
        bucket_s = float(tl.get("bucket_s", 1.0))
        n = 1 + max([int(b) for b in tl["tokens"]] or [0])
        w = max(1, int(round(SMOOTH_S / bucket_s)))
        service = {t: _series(s, n) for t, s in tl["tenant_service"].items()}
        total = _trailing_sum(sum(service.values()) if service else np.zeros(n), w)
        ok = total > 0
        x = (np.arange(n) + 1) * bucket_s
        backlog = _backlog_buckets(run["records"], "tenant", n, bucket_s)
        contract = run.get("contract")
        weights = {t: (contract.tenant(t).weight if contract else 1.0) for t in all_tenants}
        mins = {t: (contract.tenant(t).min_share if contract else 0.0) for t in all_tenants}
        groups = {t: [t] for t in shown}
        if other:
            groups["other"] = [t for t in all_tenants if t not in shown]
        ent = {g: np.full(n, np.nan) for g in groups}
        cache: dict[frozenset, dict] = {}
        for b in range(n):
            members = frozenset(t for t, bl in backlog.items() if bl[b])
            if len(members) < 2:
                continue
            e = cache.get(members)
            if e is None:
                shares = entitled_shares({t: weights.get(t, 1.0) for t in members},
                                         {t: mins.get(t, 0.0) for t in members})
                e = cache[members] = {g: sum(shares.get(t, 0.0) for t in ms) for g, ms in groups.items()}
            for g, v in e.items():
                ent[g][b] = v
        for g, members in groups.items():
            got = sum((service[t] for t in members if t in service), np.zeros(n))
            share = np.where(ok, _trailing_sum(got, w) / np.where(ok, total, 1), np.nan)
            ax.plot(x, share, color=colors[g], lw=1.4, label=g)
            e = ent[g]
            if np.isfinite(e).any():
                have = np.isfinite(e)
                num = _trailing_sum(np.where(have, e, 0.0), w)
                cnt = _trailing_sum(have.astype(float), w)
                e_s = np.where(have, num / np.maximum(cnt, 1.0), np.nan)   # same trailing window
                ax.plot(x, e_s, color=colors[g], lw=1.0, ls="--", alpha=0.8)
        ax.set_title(pol)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"token share ({SMOOTH_S:.0f} s window)")
    _legend(axes[-1], fontsize=8, loc="upper right", framealpha=0.85)
    return _png(fig)


def _cdf(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    a = np.sort(np.asarray(values, dtype=float))
    if a.size > CDF_POINTS:
        idx = np.unique(np.linspace(0, a.size - 1, CDF_POINTS).round().astype(int))
        return a[idx], (idx + 1) / a.size
    return a, np.arange(1, a.size + 1) / a.size


def _fig_latency(runs: dict, key: str, groups: list[str], fig: Figure) -> str:
    policies = list(runs)
    axes = fig.subplots(2, len(policies), squeeze=False)
    fig.set_size_inches(3.4 * len(policies) + 0.6, 5.6)
    colors = _colors(groups)
    wanted = set(groups)
    for j, pol in enumerate(policies):
        ttft: dict[str, list] = {g: [] for g in groups}
        tpot: dict[str, list] = {g: [] for g in groups}
        for rec in runs[pol]["records"]:
            g = rec[key]
            if g not in wanted or rec["first_token_s"] is None:
                continue
            ttft[g].append(max(1e-4, rec["first_token_s"] - rec["arrival_s"]))
            if rec["status"] == "finished" and rec["output_tokens"] > 1:
                tpot[g].append(max(1e-5, (rec["finish_s"] - rec["first_token_s"]) / (rec["output_tokens"] - 1)))
        for row, (data, label) in enumerate(((ttft, "TTFT (s)"), (tpot, "TPOT (s)"))):
            ax = axes[row][j]
            for g in groups:
                if data[g]:
                    xs, ys = _cdf(data[g])
                    ax.step(xs, ys, where="post", color=colors[g], lw=1.3, label=g)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_ylim(0, 1.01)
            ax.set_xlabel(label)
            ax.grid(alpha=0.3, which="both")
            if row == 0:
                ax.set_title(pol)
            if j == 0:
                ax.set_ylabel("fraction of requests")
    _legend(axes[0][-1], fontsize=8, loc="lower right", framealpha=0.85)
    return _png(fig)


def _fig_slowdown(runs: dict, key: str, groups: list[str], fig: Figure) -> str:
    policies = list(runs)
    ax = fig.subplots()
    fig.set_size_inches(max(6.0, 1.1 * len(groups) * max(1, len(policies)) / 2.2 + 2), 3.4)
    pcol = _colors(policies)
    width = 0.8 / max(1, len(policies))
    x = np.arange(len(groups))
    table = "tenants" if key == "tenant" else "classes"
    for i, pol in enumerate(policies):
        m = runs[pol]["summary"].get(table, {})
        p50 = [(m.get(g, {}).get("slowdown", {}).get("p50") or np.nan) for g in groups]
        p99 = [(m.get(g, {}).get("slowdown", {}).get("p99") or np.nan) for g in groups]
        xs = x - 0.4 + width * (i + 0.5)
        ax.bar(xs, p50, width=width * 0.92, color=pcol[pol], label=pol)
        ax.scatter(xs, p99, marker="_", s=120, color="black", zorder=3, lw=1.5)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(groups, rotation=20 if len(groups) > 4 else 0, ha="right" if len(groups) > 4 else "center")
    ax.set_ylabel("slowdown vs alone (p50 bar, p99 tick)")
    ax.axhline(1.0, color="#555", lw=0.8)
    ax.grid(alpha=0.3, axis="y", which="both")
    _legend(ax, fontsize=8, ncol=min(6, len(policies)), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return _png(fig)


def _fig_queue_kv(runs: dict, fig: Figure) -> str:
    policies = list(runs)
    axes = fig.subplots(1, 2)
    fig.set_size_inches(13, 3.3)
    pcol = _colors(policies)
    for pol in policies:
        tl = runs[pol]["timeline"]
        bucket_s = float(tl.get("bucket_s", 1.0))
        n = 1 + max([int(b) for b in tl["tokens"]] or [0])
        x = (np.arange(n) + 1) * bucket_s
        axes[0].plot(x, _last_value_series(tl["queue_len"], n), color=pcol[pol], lw=1.2, label=pol)
        axes[1].plot(x, 100 * _last_value_series(tl["kv_usage"], n), color=pcol[pol], lw=1.2, label=pol)
    axes[0].set_ylabel("waiting requests")
    axes[1].set_ylabel("KV cache in use (%)")
    axes[1].set_ylim(0, 102)
    for ax in axes:
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    _legend(axes[0], fontsize=8)
    return _png(fig)


def _fig_preemptions(runs: dict, fig: Figure) -> str | None:
    policies = list(runs)
    events = {p: runs[p]["timeline"].get("preemptions", []) for p in policies}
    if not any(events.values()):
        return None
    ax = fig.subplots()
    fig.set_size_inches(13, 0.55 * len(policies) + 1.2)
    pcol = _colors(policies)
    for i, pol in enumerate(policies):
        ts = [e[0] for e in events[pol]]
        if ts:
            ax.scatter(ts, np.full(len(ts), i), marker="|", s=160, color=pcol[pol], lw=1.0)
    ax.set_yticks(range(len(policies)))
    ax.set_yticklabels([f"{p} ({len(events[p])})" for p in policies])
    ax.set_ylim(len(policies) - 0.4, -0.6)          # first policy on top
    ax.set_xlabel("time (s)")
    ax.grid(alpha=0.3, axis="x")
    return _png(fig)


# -- HTML --------------------------------------------------------------------------------
def _table_html(runs: dict, verdicts: dict[str, bool]) -> str:
    from .compare import table_rows
    rows = table_rows({p: r["summary"] for p, r in runs.items()}, verdicts)
    head = ("<tr><th class=l>policy</th><th>throughput (tok/s)</th><th>Jain min</th><th>starvation</th>"
            "<th class=l>worst tenant P99 TTFT (s)</th><th>max slowdown</th><th>preemptions</th>"
            "<th>recovery %</th><th>rejected</th><th>verdict</th></tr>")
    body = []
    for r in rows:
        v = r["verdict"]
        cls = "pass" if v == "pass" else "fail" if v == "fail" else ""
        worst = "–" if r["worst_ttft_p99_s"] is None else f"{r['worst_ttft_p99_s']:.3g} ({_esc(r['worst_tenant'])})"
        body.append(f"<tr><td class=l><b>{_esc(r['policy'])}</b></td><td>{_fmt(r['throughput'], '{:,.0f}')}</td>"
                    f"<td>{_fmt(r['jain_min'], '{:.3f}')}</td><td>{r['starvation']}</td><td class=l>{worst}</td>"
                    f"<td>{_fmt(r['max_slowdown'], '{:.3g}')}</td><td>{r['preemptions']}</td>"
                    f"<td>{_fmt(r['recovery_pct'], '{:.2f}')}</td><td>{r['rejected']}</td>"
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
              _fig_shares(runs, fig)]
    label = "tenant" if key == "tenant" else "class (more than 8 tenants)"
    parts += [f"<h3>TTFT and TPOT distributions per {label}</h3>",
              "<p class=how>Cumulative distribution (log time axis): a curve further left is faster; a long flat "
              "tail on the right is a group kept waiting. Top row time to first token, bottom row time per "
              "output token.</p>",
              _fig_latency(runs, key, groups, fig)]
    parts += [f"<h3>Slowdown per {key}</h3>",
              "<p class=how>End-to-end latency divided by the same request's latency alone on an empty engine "
              "(1 = no interference). Bars: median; black ticks: P99. Log scale.</p>",
              _fig_slowdown(runs, key, groups, fig)]
    parts += ["<h3>Queue length and KV cache use</h3>",
              "<p class=how>Waiting requests and the fraction of KV blocks held at the end of each second. A queue "
              "that never drains means the workload overloads the engine; KV near 100% explains preemptions.</p>",
              _fig_queue_kv(runs, fig)]
    pre = _fig_preemptions(runs, fig)
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
