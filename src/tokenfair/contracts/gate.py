"""``tokenfair gate``: a release gate for a contract change on recorded or public traffic.

Both contracts (baseline A, candidate B) are simulated with the same policy and profile on
the same traces.  For every trace the gate

  1. puts the compared metrics side by side (the ``compare`` catalogue of the thresholds
     file: per tenant, per class and global; a metric the summary lacks is "not measured");
  2. checks the candidate against the thresholds' absolute limits (:func:`tokenfair.evaluation.thresholds.evaluate`,
     with the baseline's run as the throughput reference);
  3. checks each compared metric against ``max_regression`` (how far B may fall behind A).

The verdict passes when every check of every trace passes.  Nothing here prints or exits:
:mod:`tokenfair.cli.contracts` does, and :mod:`tokenfair.contracts.gate_report` renders the HTML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .contract import Contract
from ..core.costmodel import Profile
from ..evaluation.thresholds import Check, GateSpec, MetricSpec, RegressionLimit, Thresholds, evaluate
from ..workloads.workload import Workload

Progress = Callable[[str], None] | None
EPS = 1e-12


@dataclass(frozen=True, slots=True)
class Row:
    """One compared figure of one trace."""

    scope: str               # "global" | "tenant" | "class"
    group: str               # the tenant or class name ("" for global)
    metric: str              # the catalogue's metric name
    better: str              # "lower" | "higher"
    baseline: float | None   # None: not measured (the summary lacks the path or the group)
    candidate: float | None

    @property
    def delta(self) -> float | None:
        if self.baseline is None or self.candidate is None:
            return None
        return self.candidate - self.baseline

    @property
    def label(self) -> str:
        return self.metric if self.scope == "global" else f"{self.scope}[{self.group}].{self.metric}"


@dataclass
class TraceGate:
    """The gate on one trace."""

    name: str
    rows: list[Row]
    checks: list[Check]                        # absolute limits, then regressions
    summaries: dict[str, dict] = field(default_factory=dict)   # "baseline" | "candidate" -> summary

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def lookup(summary: dict, path: str, name: str = "") -> float | None:
    """The number at dotted ``path`` of ``summary`` (``{name}`` substituted), None when absent."""
    cur: object = summary
    for part in path.replace("{name}", name).split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    if isinstance(cur, bool) or not isinstance(cur, (int, float)):
        return None
    return float(cur)


def _value(summary: dict, scope: str, group: str, spec: MetricSpec) -> float | None:
    if scope == "global":
        v = lookup(summary, spec.path)
        present = True
    elif spec.path.startswith("/"):
        v = lookup(summary, spec.path[1:], group)
        present = group in summary.get("tenants" if scope == "tenant" else "classes", {})
    else:
        table = summary.get("tenants" if scope == "tenant" else "classes", {})
        present = group in table
        v = lookup(table.get(group, {}), spec.path)
    if v is None and present and spec.missing is not None:
        v = spec.missing
    return v


def compare_rows(base: dict, cand: dict, thresholds: Thresholds) -> list[Row]:
    rows = []
    for metric, spec in thresholds.compare.overall.items():
        rows.append(Row("global", "", metric, spec.better, _value(base, "global", "", spec),
                        _value(cand, "global", "", spec)))
    for scope, key in (("tenant", "tenants"), ("class", "classes")):
        groups = sorted(set(base.get(key, {})) | set(cand.get(key, {})))
        for g in groups:
            for metric, spec in thresholds.compare.groups.items():
                if scope not in spec.scopes:
                    continue
                rows.append(Row(scope, g, metric, spec.better, _value(base, scope, g, spec), _value(cand, scope, g, spec)))
    return rows


def regression_check(row: Row, lim: RegressionLimit) -> Check | None:
    """The candidate against the baseline on ``row``; None when either side is not measured."""
    if row.baseline is None or row.candidate is None:
        return None
    if row.better == "lower":
        limit = row.baseline * lim.max_ratio + lim.slack
        return Check(f"{row.label} vs baseline", row.candidate, limit, row.candidate <= limit + EPS, "<=")
    limit = row.baseline / lim.max_ratio - lim.slack
    return Check(f"{row.label} vs baseline", row.candidate, limit, row.candidate >= limit - EPS, ">=")


def regression_checks(rows: list[Row], gate: GateSpec) -> list[Check]:
    out = []
    for row in rows:
        lim = gate.max_regression.get(row.metric)
        c = regression_check(row, lim) if lim is not None else None
        if c is not None:
            out.append(c)
    return out


def gate_summaries(name: str, base: dict, cand: dict, thresholds: Thresholds) -> TraceGate:
    gate = thresholds.for_workload(cand.get("workload"))
    rows = compare_rows(base, cand, thresholds)
    checks = evaluate(cand, gate, base, baseline_name="baseline") + regression_checks(rows, gate)
    return TraceGate(name, rows, checks, {"baseline": base, "candidate": cand})


def run_gate(workloads: list[Workload], baseline: Contract, candidate: Contract, profile: Profile,
             thresholds: Thresholds, *, policy: str = "fair", out_dir: str | Path | None = None,
             progress: Progress = None) -> list[TraceGate]:
    """Simulate both contracts on every workload; one :class:`TraceGate` per workload, the runs
    written under ``out_dir/<trace>/{baseline,candidate}/`` when given."""
    from ..runtime.output import write_run
    from ..sim.simulate import simulate
    result = []
    names = trace_names([w.name for w in workloads])
    for wl, name in zip(workloads, names):
        sums = {}
        for role, c in (("baseline", baseline), ("candidate", candidate)):
            if progress is not None:
                progress(f"  {name}: simulating the {role} {c.version}@{c.content_hash} ({len(wl)} requests)")
            res = simulate(wl, policy, c, profile, isolated=False)
            sums[role] = res.summary
            if out_dir is not None:
                write_run(Path(out_dir) / name / role, res.records, res.summary, res.timeline)
        result.append(gate_summaries(name, sums["baseline"], sums["candidate"], thresholds))
    return result


def trace_names(names: list[str]) -> list[str]:
    """File-safe, unique names for the traces' output folders."""
    out: list[str] = []
    for n in names:
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in Path(n).stem or n) or "trace"
        cand, k = safe, 2
        while cand in out:
            cand, k = f"{safe}-{k}", k + 1
        out.append(cand)
    return out


def _num(v: float | None) -> str:
    if v is None:
        return "not measured"
    return f"{v:.4g}"


def gate_table(tg: TraceGate, max_rows: int = 200) -> str:
    """The terminal table of one trace: side-by-side figures, then every breached check."""
    lines = [f"trace {tg.name}: {'PASS' if tg.passed else 'FAIL'}",
             f"  {'metric':<44}{'baseline':>14}{'candidate':>14}{'delta':>12}"]
    for row in tg.rows[:max_rows]:
        d = row.delta
        lines.append(f"  {row.label[:43]:<44}{_num(row.baseline):>14}{_num(row.candidate):>14}"
                     f"{'' if d is None else f'{d:+.4g}':>12}")
    if len(tg.rows) > max_rows:
        lines.append(f"  ... {len(tg.rows) - max_rows} more rows in the HTML report")
    for c in tg.checks:
        if not c.passed:
            lines.append(f"  BREACH {c.name}: {_num(c.value)} (limit {c.op} {c.limit:.4g})")
    return "\n".join(lines)
