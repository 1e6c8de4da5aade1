"""``tokenfair sweep``: many contract variants on the same traces, ranked by the release gate.

The grid file (YAML)::

    base: contract.yaml          # every variant starts from it (relative to the grid file);
                                 # it is also the gate's baseline unless --baseline is given
    vary:                        # dotted contract paths -> the values to try
      tenants.light.weight: [1, 2, 4]
      tenants.heavy.min_share: [0, 0.2]
      admission.shed_margin: [0.5, 0.75]
    light_tenants: [light]       # optional: the tenants whose P99 TTFT the trade-off plot shows
                                 # (default: those whose mean request is below the median)

Variants are the Cartesian product (at most ``MAX_VARIANTS``), each validated before anything
runs (a bad one is an error naming its values).  Each variant is simulated on every trace in a
worker process and gated against the baseline (:mod:`tokenfair.contracts.gate`).  Ranking: variants that
pass every check first, then fewer breaches, then lower light-tenant P99 TTFT, then higher
throughput, then the variant number.
"""

from __future__ import annotations

import itertools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from .contract import Contract, ContractError, load_contract, parse_contract, read_yaml
from ..core.costmodel import Profile
from .gate import TraceGate, gate_summaries
from ..evaluation.thresholds import Thresholds
from ..workloads.workload import Workload

MAX_VARIANTS = 512


class GridError(ValueError):
    """A grid file that cannot be used; the message names the place and the fix."""


@dataclass(frozen=True, slots=True)
class Variant:
    index: int                     # 1-based, in grid order
    values: dict[str, object]      # dotted path -> value
    contract: Contract


@dataclass
class Grid:
    base: Contract
    variants: list[Variant]
    light_tenants: list[str] | None


@dataclass
class VariantResult:
    variant: Variant
    gates: list[TraceGate]
    light_ttft_p99_s: float | None     # worst P99 TTFT over the light tenants and traces
    throughput_tokens_per_s: float     # mean over traces

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    @property
    def breaches(self) -> list[str]:
        return [f"{g.name}:{c.name}" for g in self.gates for c in g.checks if not c.passed]

    def rank_key(self) -> tuple:
        light = self.light_ttft_p99_s if self.light_ttft_p99_s is not None else float("inf")
        return (not self.passed, len(self.breaches), light, -self.throughput_tokens_per_s, self.variant.index)


def _set_path(d: dict, path: str, value: object, where: str) -> None:
    parts = path.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise GridError(f"{where}: vary path {path!r}: {p!r} is not a mapping in the contract")
        cur = nxt
    cur[parts[-1]] = value


def load_grid(path: str | Path) -> Grid:
    p = Path(path)
    data = read_yaml(p, "grid file", GridError)
    if not isinstance(data, dict) or "base" not in data or "vary" not in data:
        raise GridError(f"{p}: a grid file is a mapping with 'base: CONTRACT.yaml' and 'vary: {{path: [values]}}'")
    unknown = set(data) - {"base", "vary", "light_tenants"}
    if unknown:
        raise GridError(f"{p}: unknown key(s) {sorted(unknown)}; allowed: base, vary, light_tenants")
    base_path = (p.parent / str(data["base"])) if not Path(str(data["base"])).is_absolute() else Path(str(data["base"]))
    base = load_contract(base_path)
    vary = data["vary"]
    if not isinstance(vary, dict) or not vary or not all(isinstance(v, list) and v for v in vary.values()):
        raise GridError(f"{p}: vary: give each dotted contract path a non-empty list of values")
    n = 1
    for v in vary.values():
        n *= len(v)
    if n > MAX_VARIANTS:
        raise GridError(f"{p}: vary makes {n} variants (> {MAX_VARIANTS}); try fewer values")
    light = data.get("light_tenants")
    if light is not None and (not isinstance(light, list) or not all(isinstance(t, str) for t in light)):
        raise GridError(f"{p}: light_tenants must be a list of tenant names")
    variants = []
    keys = list(vary)
    for i, combo in enumerate(itertools.product(*(vary[k] for k in keys)), 1):
        values = dict(zip(keys, combo))
        d = base.model_dump(mode="json", exclude_unset=False)
        for k, v in values.items():
            _set_path(d, k, v, str(p))
        d["version"] = f"{base.version}-sweep{i}"
        try:
            c = parse_contract(d, f"{p} variant {i} {values}")
        except ContractError as err:
            raise GridError(str(err)) from None
        variants.append(Variant(i, values, c))
    return Grid(base, variants, light)


def light_tenants_of(workloads: list[Workload]) -> list[str]:
    """Tenants whose mean request (prompt + output tokens) is below the median tenant's."""
    sizes: dict[str, list[int]] = {}
    for wl in workloads:
        for r in wl.rows:
            sizes.setdefault(r.tenant, []).append(r.prompt_tokens + r.output_tokens)
    means = {t: sum(v) / len(v) for t, v in sizes.items()}
    if len(means) < 2:
        return sorted(means)
    med = sorted(means.values())[len(means) // 2]
    return sorted(t for t, m in means.items() if m < med) or [min(means, key=means.get)]


def check_light_tenants(grid: Grid, workloads: list[Workload]) -> None:
    """A grid's named light tenant that sends no request in the traces is refused (a misspelt
    name left the plot's light P99 TTFT blank and the ranking without its third key)."""
    if grid.light_tenants is None:
        return
    sending = {r.tenant for wl in workloads for r in wl.rows}
    absent = [t for t in grid.light_tenants if t not in sending]
    if absent:
        raise GridError(f"light_tenants: {', '.join(map(repr, absent))} sends no request in the traces "
                        f"(their tenants: {', '.join(sorted(sending))}); fix the name or leave light_tenants out")


def simulate_summaries(workloads: list[Workload], contract: Contract, profile: dict, policy: str) -> list[dict]:
    """One summary per workload (run in a worker process).  The profile travels as its fields:
    a used Profile caches its compiled step-cost object, which does not pickle."""
    from ..sim.simulate import simulate
    prof = Profile.model_validate(profile)
    return [simulate(wl, policy, contract, prof, isolated=False).summary for wl in workloads]


def _light_p99(summaries: list[dict], light: list[str]) -> float | None:
    vals = [s["tenants"][t]["ttft_s"]["p99"] for s in summaries for t in light
            if t in s.get("tenants", {}) and s["tenants"][t]["ttft_s"]["p99"] is not None]
    return max(vals) if vals else None


def run_sweep(grid: Grid, workloads: list[Workload], baseline: Contract, profile: Profile, thresholds: Thresholds,
              *, policy: str = "fair", workers: int = 2,
              progress: Callable[[int, int], None] | None = None) -> tuple[list[VariantResult], list[str], tuple]:
    """Every variant gated against ``baseline``, ranked; the light tenants used; and the
    baseline's (throughput, light tenants' P99 TTFT)."""
    from .gate import trace_names
    names = trace_names([w.name for w in workloads])
    light = grid.light_tenants if grid.light_tenants is not None else light_tenants_of(workloads)
    total = len(grid.variants) + 1
    results: dict[int, list[dict]] = {}
    # spawned, not forked: a forked child inherits the parent's threads and locks mid-state
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context("spawn")) as pool:
        fields = profile.model_dump()
        futs = {pool.submit(simulate_summaries, workloads, baseline, fields, policy): 0}
        futs |= {pool.submit(simulate_summaries, workloads, v.contract, fields, policy): v.index for v in grid.variants}
        for done, fut in enumerate(as_completed(futs), 1):
            results[futs[fut]] = fut.result()
            if progress is not None:
                progress(done, total)
    base = results[0]
    out = []
    for v in grid.variants:
        sums = results[v.index]
        gates = [gate_summaries(n, b, s, thresholds) for n, b, s in zip(names, base, sums)]
        tput = sum(s["throughput_tokens_per_s"] for s in sums) / len(sums)
        out.append(VariantResult(v, gates, _light_p99(sums, light), tput))
    out.sort(key=VariantResult.rank_key)
    base_point = (sum(s["throughput_tokens_per_s"] for s in base) / len(base), _light_p99(base, light))
    return out, light, base_point


def write_sweep(out_dir: str | Path, results: list[VariantResult], light: list[str],
                base_point: tuple[float, float | None] | None = None) -> list[Path]:
    """sweep.json, sweep.csv and the trade-off plot sweep.png."""
    import csv
    import json

    from matplotlib.figure import Figure
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    rows = [{"rank": i, "variant": r.variant.index, "version": r.variant.contract.version,
             "hash": r.variant.contract.content_hash, "passed": r.passed, "breaches": len(r.breaches),
             "light_ttft_p99_s": r.light_ttft_p99_s, "throughput_tokens_per_s": r.throughput_tokens_per_s,
             **{f"set:{k}": v for k, v in r.variant.values.items()}} for i, r in enumerate(results, 1)]
    (d / "sweep.json").write_text(json.dumps({"light_tenants": light, "variants": [
        {**row, "breached": r.breaches} for row, r in zip(rows, results)]}, indent=2))
    with (d / "sweep.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for passed, color, label in ((True, "tab:green", "passes the gate"), (False, "tab:red", "breaches")):
        pts = [r for r in results if r.passed == passed and r.light_ttft_p99_s is not None]
        ax.scatter([r.throughput_tokens_per_s for r in pts], [r.light_ttft_p99_s for r in pts], c=color, label=label)
        for r in pts:
            ax.annotate(str(r.variant.index), (r.throughput_tokens_per_s, r.light_ttft_p99_s), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    if base_point is not None and base_point[1] is not None:
        ax.scatter([base_point[0]], [base_point[1]], marker="*", s=160, c="black", label="baseline")
    ax.set_xlabel("throughput (tokens/s, mean over traces)")
    ax.set_ylabel(f"light tenants' worst P99 TTFT (s): {', '.join(light)[:60]}")
    ax.set_title("contract variants: the trade-off")
    ax.legend()
    fig.savefig(d / "sweep.png", dpi=110)
    return [d / "sweep.json", d / "sweep.csv", d / "sweep.png"]


def dump_variant(v: Variant) -> str:
    return yaml.safe_dump(v.contract.model_dump(mode="json", exclude_defaults=True), sort_keys=False)
