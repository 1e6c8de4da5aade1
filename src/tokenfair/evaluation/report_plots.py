"""The figures of the HTML policy-comparison report (:mod:`tokenfair.evaluation.report`): token share
per tenant over time, TTFT/TPOT CDFs, slowdown, queue length and KV use, preemptions.
Each is drawn on a shared matplotlib ``Figure`` (Agg backend) and returned as an inline
base64 PNG ``<img>``.

Plot cost is bounded: lines over time have at most ``plot_grid.MAX_PLOT_POINTS`` points
(whole buckets each), CDF lines are subsampled to at most 256 points, at most 8 tenant (or
class) groups are drawn, and each figure is closed as soon as it is encoded.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from .metrics import backlog_intervals, entitled_shares
from .plot_grid import PlotGrid

MAX_GROUPS = 8
SMOOTH_S = 10.0
CDF_POINTS = 256
DPI = 80


# -- small helpers ------------------------------------------------------------------------
def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buf, format="png", dpi=DPI)
    fig.clear()
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img class="plot" alt="plot" src="data:image/png;base64,{data}">'


def _trailing_sum(a: np.ndarray, w: int) -> np.ndarray:
    c = np.cumsum(np.concatenate([[0.0], a]))
    idx = np.arange(1, a.size + 1)
    return c[idx] - c[np.maximum(0, idx - w)]


def _legend(ax, **kw) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def _colors(names: list[str]) -> dict[str, str]:
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
               "#17becf", "#7f7f7f", "#bcbd22"]
    return {n: palette[i % len(palette)] for i, n in enumerate(names)}


# -- figures -----------------------------------------------------------------------------
def fig_shares(runs: dict, fig: Figure) -> str:
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
        grid = PlotGrid.of(tl)
        n = grid.num_points
        w = max(1, int(round(SMOOTH_S / (grid.bucket_s * grid.per_point))))
        service = {t: grid.sums(s) for t, s in tl["tenant_service"].items()}
        total = _trailing_sum(sum(service.values()) if service else np.zeros(n), w)
        ok = total > 0
        x = grid.x()
        backlog = backlog_intervals(run["records"], "tenant", grid.n_buckets, grid.bucket_s)
        names = list(backlog)
        flags = np.array([grid.backlogged(backlog[t]) for t in names]).reshape(len(names), n)
        contract = run.get("contract")
        weights = {t: (contract.tenant(t).weight if contract else 1.0) for t in all_tenants}
        mins = {t: (contract.tenant(t).min_share if contract else 0.0) for t in all_tenants}
        groups = {t: [t] for t in shown}
        if other:
            groups["other"] = [t for t in all_tenants if t not in shown]
        ent = {g: np.full(n, np.nan) for g in groups}
        cache: dict[tuple[int, ...], dict] = {}
        for b in range(n):
            members = tuple(np.flatnonzero(flags[:, b]).tolist())
            if len(members) < 2:
                continue
            e = cache.get(members)
            if e is None:
                shares = entitled_shares({names[i]: weights.get(names[i], 1.0) for i in members},
                                         {names[i]: mins.get(names[i], 0.0) for i in members})
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


def fig_latency(runs: dict, key: str, groups: list[str], fig: Figure) -> str:
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


def fig_slowdown(runs: dict, key: str, groups: list[str], fig: Figure) -> str:
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


def fig_queue_kv(runs: dict, fig: Figure) -> str:
    policies = list(runs)
    axes = fig.subplots(1, 2)
    fig.set_size_inches(13, 3.3)
    pcol = _colors(policies)
    for pol in policies:
        grid = PlotGrid.of(runs[pol]["timeline"])
        tl = runs[pol]["timeline"]
        x = grid.x()
        axes[0].plot(x, grid.last_values(tl["queue_len"]), color=pcol[pol], lw=1.2, label=pol)
        axes[1].plot(x, 100 * grid.last_values(tl["kv_usage"]), color=pcol[pol], lw=1.2, label=pol)
    axes[0].set_ylabel("waiting requests")
    axes[1].set_ylabel("KV cache in use (%)")
    axes[1].set_ylim(0, 102)
    for ax in axes:
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    _legend(axes[0], fontsize=8)
    return _png(fig)


def fig_preemptions(runs: dict, fig: Figure) -> str | None:
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
