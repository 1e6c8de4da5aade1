"""``tokenfair shadow``: replay what the service recorded under the live contract and under a
candidate, and say how far to trust the difference.

  1. the records (``serve``/``gateway`` ``--records``, rotated files included) become a trace
     (:mod:`tokenfair.workloads.records`);
  2. the profile is the one given (``tokenfair calibrate`` for the built-in engine) or one
     fitted from the records' own timings (:mod:`tokenfair.contracts.records_profile`);
  3. the simulator replays the trace under the live contract -- its per-tenant figures
     against what the service measured are the *simulator's error* -- and under the
     candidate; the deltas candidate - live are simulator against simulator, and the gate's
     checks (:mod:`tokenfair.contracts.gate`) run on them.

The live contract is the one given, or the version the records name (``contract_version``)
looked up in a contract store.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .contract import Contract
from ..core.costmodel import Profile
from .gate import TraceGate, gate_summaries
from ..evaluation.measured import measured_summary
from ..evaluation.thresholds import Thresholds
from ..workloads.workload import Workload

# the per-tenant figures whose simulator error is reported: (label, path in a group's metrics)
ERROR_FIGURES = (("ttft_p50_s", ("ttft_s", "p50")), ("ttft_p99_s", ("ttft_s", "p99")),
                 ("tpot_p99_s", ("tpot_s", "p99")), ("e2e_p99_s", ("e2e_s", "p99")))


@dataclass(frozen=True, slots=True)
class ErrorRow:
    tenant: str
    figure: str
    measured: float | None     # what the service recorded
    simulated: float | None    # the simulator under the live contract

    @property
    def rel_error(self) -> float | None:
        if self.measured is None or self.simulated is None or self.measured <= 0:
            return None
        return (self.simulated - self.measured) / self.measured


@dataclass
class ShadowResult:
    workload: Workload
    profile: Profile
    live: Contract
    candidate: Contract
    errors: list[ErrorRow]
    gate: TraceGate                      # sim(live) as baseline, sim(candidate) as candidate
    measured: dict                       # the service's own figures (measured_summary)


def versions_in(records: list[dict]) -> Counter:
    return Counter(r.get("contract_version") for r in records if r.get("contract_version"))


def _get(metrics: dict, path: tuple[str, str]) -> float | None:
    v = metrics.get(path[0], {}).get(path[1])
    return float(v) if isinstance(v, (int, float)) else None


def error_rows(measured: dict, simulated: dict) -> list[ErrorRow]:
    out = []
    for t in sorted(measured.get("tenants", {})):
        m, s = measured["tenants"][t], simulated.get("tenants", {}).get(t, {})
        for label, path in ERROR_FIGURES:
            out.append(ErrorRow(t, label, _get(m, path), _get(s, path)))
    return out


def run_shadow(records: list[dict], workload: Workload, live: Contract, candidate: Contract, profile: Profile,
               thresholds: Thresholds, *, policy: str = "fair", out_dir=None) -> ShadowResult:
    from pathlib import Path

    from ..runtime.output import write_run
    from ..sim.simulate import simulate
    sums = {}
    for role, c in (("live", live), ("candidate", candidate)):
        res = simulate(workload, policy, c, profile, isolated=False)
        sums[role] = res.summary
        if out_dir is not None:
            write_run(Path(out_dir) / role, res.records, res.summary, res.timeline)
    measured = measured_summary(records)
    g = gate_summaries(workload.name, sums["live"], sums["candidate"], thresholds)
    return ShadowResult(workload, profile, live, candidate, error_rows(measured, sums["live"]), g, measured)


def _f(v: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def shadow_table(res: ShadowResult) -> str:
    lines = [f"shadow replay of {len(res.workload)} recorded requests; profile {res.profile.name}",
             f"live {res.live.version}@{res.live.content_hash} -> candidate "
             f"{res.candidate.version}@{res.candidate.content_hash}",
             "simulator error under the live contract (simulated vs recorded):",
             f"  {'tenant':<16}{'figure':<12}{'recorded':>10}{'simulated':>11}{'error':>9}"]
    for e in res.errors:
        err = e.rel_error
        lines.append(f"  {e.tenant[:15]:<16}{e.figure:<12}{_f(e.measured):>10}{_f(e.simulated):>11}"
                     f"{'-' if err is None else f'{err:+.1%}':>9}")
    lines.append("per-tenant deltas, candidate - live (both simulated), next to the simulator's error on that "
                 "figure under the live contract:")
    lines.append(f"  {'tenant':<16}{'figure':<20}{'live':>10}{'candidate':>11}{'delta':>10}{'sim error':>11}")
    error_of = {(e.tenant, e.figure): e.rel_error for e in res.errors}
    for row in res.gate.rows:
        if row.scope != "tenant":
            continue
        d, err = row.delta, error_of.get((row.group, row.metric))
        lines.append(f"  {row.group[:15]:<16}{row.metric[:19]:<20}{_f(row.baseline):>10}{_f(row.candidate):>11}"
                     f"{'-' if d is None else f'{d:+.3f}':>10}{'-' if err is None else f'{err:+.1%}':>11}")
    breached = [c.name for c in res.gate.checks if not c.passed]
    lines.append("checks: " + ("all pass" if not breached else "BREACHED " + ", ".join(breached)))
    return "\n".join(lines)
