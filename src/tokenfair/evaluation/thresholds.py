"""Release-gate thresholds: a YAML file of limits, and their evaluation against a run summary.

The file (default: ``tokenfair/data/thresholds.yaml``) has a ``default`` gate and per-workload
overrides under ``scenarios.<workload name>``; see that file for the fields.  It is validated
by pydantic (``extra="forbid"``); errors are ``file: path: message`` lines raised as
:class:`ThresholdsError` (a ``ValueError``, so the CLI exits 2).

:func:`evaluate` turns one summary (``tokenfair.evaluation.metrics.summarize`` schema) into a list of
:class:`Check` rows.  A fairness metric that does not apply to the run (``jain_min`` is None
when fewer than two tenants were ever backlogged together) passes with ``value=None``;
the throughput ratio compares finished tokens by the same horizon (``vs_fifo``), never
tokens per second of each run's own makespan (which rises when work is rejected);
``min_class_share_ratio`` checks each class with a ``min_share`` that was backlogged
(``fairness.class_min_share``: share received while backlogged / min_share); a
latency limit on a tenant/class that has requests but no measured value (none got a first
token, or none produced two tokens for TPOT) fails, because nothing was served.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..contracts.contract import parse_mapping, read_yaml


class ThresholdsError(ValueError):
    """A thresholds file that cannot be used; the message names each bad path."""


class _Strict(BaseModel):
    # every number finite (a limit that should not apply is left out)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GroupLimits(_Strict):
    """Limits for one tenant or class (or every one: key ``"*"``)."""

    max_ttft_p99_s: float | None = Field(default=None, gt=0)
    max_tpot_p99_s: float | None = Field(default=None, gt=0)
    max_starvation_events: int | None = Field(default=None, ge=0)


class RegressionLimit(_Strict):
    """How much worse than the baseline a candidate may be on one compared metric (``tokenfair
    gate``): lower-is-better metrics must stay <= baseline x max_ratio + slack, higher-is-better
    ones >= baseline / max_ratio - slack."""

    max_ratio: float = Field(default=1.0, ge=1.0)
    slack: float = Field(default=0.0, ge=0)


class MetricSpec(_Strict):
    """One compared metric: a dotted path inside a summary.  Per-group metrics (``groups``)
    are read inside ``summary.tenants.<name>`` and ``summary.classes.<name>``; a path starting
    with ``/`` is read from the summary's root with ``{name}`` replaced by the group's name.
    A path the summary lacks is "not measured" (or ``missing`` when given, e.g. 0 for counts)."""

    path: str
    better: Literal["lower", "higher"] = "lower"
    missing: float | None = None
    scopes: tuple[Literal["tenant", "class"], ...] = ("tenant", "class")   # groups only


class GateSpec(_Strict):
    min_jain: float | None = Field(default=None, ge=0, le=1)
    max_share_deviation: float | None = Field(default=None, ge=0, le=1)
    max_starvation_events: int | None = Field(default=None, ge=0)
    min_throughput_ratio_vs_fifo: float | None = Field(default=None, gt=0)
    min_class_share_ratio: float | None = Field(default=None, gt=0)
    # rejected / requests, and requests that met their SLOs / requests (the live canary's checks)
    max_rejection_rate: float | None = Field(default=None, ge=0, le=1)
    min_goodput_fraction: float | None = Field(default=None, ge=0, le=1)
    max_longest_service_gap_s: float | None = Field(default=None, gt=0)
    max_overdue_within_share: int | None = Field(default=None, ge=0)
    min_in_time_goodput_ratio_vs_fifo: float | None = Field(default=None, gt=0)
    tenants: dict[str, GroupLimits] = Field(default_factory=dict)   # "*": every tenant
    classes: dict[str, GroupLimits] = Field(default_factory=dict)   # "*": every class
    # tokenfair gate: compared metric name -> how far the candidate may fall behind the baseline
    max_regression: dict[str, RegressionLimit] = Field(default_factory=dict)


class CompareSpec(_Strict):
    """The metrics ``tokenfair gate`` compares, per tenant/class (``groups``) and global."""

    groups: dict[str, MetricSpec] = Field(default_factory=dict)
    overall: dict[str, MetricSpec] = Field(default_factory=dict)


class Thresholds(_Strict):
    version: str = "unversioned"
    default: GateSpec = GateSpec()
    scenarios: dict[str, GateSpec] = Field(default_factory=dict)
    compare: CompareSpec = CompareSpec()

    def for_workload(self, name: str | None) -> GateSpec:
        """The default gate with the overrides for workload ``name`` applied field by field."""
        over = self.scenarios.get(name or "")
        if over is None:
            return self.default
        merged = self.default.model_dump(exclude_unset=True)
        for f in over.model_fields_set:
            if f in ("tenants", "classes"):
                table = {k: v.model_dump(exclude_unset=True) for k, v in getattr(self.default, f).items()}
                for key, lim in getattr(over, f).items():
                    table[key] = table.get(key, {}) | lim.model_dump(exclude_unset=True)
                merged[f] = table
            else:
                merged[f] = getattr(over, f)
        return GateSpec.model_validate(merged)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    value: float | None
    limit: float
    passed: bool
    op: str = "<="        # how value compares with limit when it passes

    def as_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "limit": self.limit, "passed": self.passed, "op": self.op}


def parse_thresholds(data: object, source: str = "<thresholds>") -> Thresholds:
    return parse_mapping(Thresholds, data, source, "the thresholds file", ThresholdsError)


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """The thresholds in ``path``, or the packaged default gate when ``path`` is None."""
    if path is None:
        with resources.as_file(resources.files("tokenfair") / "data" / "thresholds.yaml") as p:
            return load_thresholds(p)
    return parse_thresholds(read_yaml(path, "thresholds file", ThresholdsError), str(path))


def _max(name: str, value, limit) -> Check:
    return Check(name, value, limit, value is not None and value <= limit + 1e-12, "<=")


_GROUP_CHECKS = (("max_ttft_p99_s", "ttft_p99_s", lambda m: m["ttft_s"]["p99"]),
                 ("max_tpot_p99_s", "tpot_p99_s", lambda m: m["tpot_s"]["p99"]),
                 ("max_starvation_events", "starvation_events", lambda m: m.get("starvation_events", 0)))


def _group_checks(kind: str, groups: dict[str, dict], table: dict[str, GroupLimits]) -> list[Check]:
    out = []
    star = table.get("*", GroupLimits())
    for g in sorted(groups):
        own = table.get(g)
        for field, label, get in _GROUP_CHECKS:
            lim = getattr(own, field) if own is not None and field in own.model_fields_set else getattr(star, field)
            if lim is not None:
                out.append(_max(f"{kind}[{g}].{label}", get(groups[g]), lim))
    return out


def _throughput_ratio(summary: dict, baseline_summary: dict, same_horizon: bool = True) -> float | None:
    """Finished tokens over fifo's by the same horizon (``summary["vs_fifo"]``, written by
    compare; ``same_horizon=False`` when the baseline is not fifo's run); without it the
    finished tokens of the whole runs, then tokens/s (old summaries)."""
    same = summary.get("vs_fifo") if same_horizon else None
    if same is not None:
        return same["ratio"]
    for key in ("finished_tokens", "throughput_tokens_per_s"):
        base = baseline_summary.get(key) or 0.0
        if key in summary and base > 0:
            return summary[key] / base
    return None


def evaluate(summary: dict, thresholds: Thresholds | GateSpec | None = None,
             baseline_summary: dict | None = None, baseline_name: str = "fifo") -> list[Check]:
    """Every check of the gate for ``summary``'s workload; ``baseline_summary`` is
    ``baseline_name``'s run on the same workload (the throughput-ratio check is left out
    without it)."""
    if thresholds is None:
        thresholds = load_thresholds()
    gate = thresholds.for_workload(summary.get("workload")) if isinstance(thresholds, Thresholds) else thresholds
    fair = summary.get("fairness", {})
    checks: list[Check] = []
    if gate.min_jain is not None:
        v = fair.get("jain_min")
        checks.append(Check("jain_min", v, gate.min_jain, v is None or v >= gate.min_jain - 1e-12, ">="))
    if gate.max_share_deviation is not None:
        v = fair.get("max_abs_share_deviation")
        checks.append(Check("max_abs_share_deviation", v, gate.max_share_deviation,
                            v is None or v <= gate.max_share_deviation + 1e-12))
    if gate.max_starvation_events is not None:
        checks.append(_max("starvation_events", summary.get("starvation_events", 0), gate.max_starvation_events))
    if gate.min_throughput_ratio_vs_fifo is not None and baseline_summary is not None:
        v = _throughput_ratio(summary, baseline_summary, same_horizon=baseline_name == "fifo")
        checks.append(Check(f"throughput_ratio_vs_{baseline_name}", v, gate.min_throughput_ratio_vs_fifo,
                            v is None or v >= gate.min_throughput_ratio_vs_fifo - 1e-12, ">="))
    if gate.min_in_time_goodput_ratio_vs_fifo is not None and baseline_summary is not None:
        base = baseline_summary.get("goodput", {}).get("in_time_tokens") or 0
        v = summary.get("goodput", {}).get("in_time_tokens", 0) / base if base > 0 else None
        checks.append(Check("in_time_goodput_ratio_vs_fifo", v, gate.min_in_time_goodput_ratio_vs_fifo,
                            v is None or v >= gate.min_in_time_goodput_ratio_vs_fifo - 1e-12, ">="))
    if gate.max_longest_service_gap_s is not None:
        checks.append(_max("longest_service_gap_s", summary.get("longest_service_gap_s", 0.0),
                           gate.max_longest_service_gap_s))
    if gate.max_overdue_within_share is not None:
        checks.append(_max("overdue_within_share", summary.get("overdue_within_share", 0),
                           gate.max_overdue_within_share))
    if gate.min_class_share_ratio is not None:
        for c, m in sorted(fair.get("class_min_share", {}).items()):
            v = m.get("ratio_to_min_share")
            checks.append(Check(f"class[{c}].share_vs_min_share", v, gate.min_class_share_ratio,
                                v is not None and v >= gate.min_class_share_ratio - 1e-12, ">="))
    checks += _fraction_checks(summary, gate)
    checks += _group_checks("tenant", summary.get("tenants", {}), gate.tenants)
    checks += _group_checks("class", summary.get("classes", {}), gate.classes)
    return checks


def _fraction_checks(summary: dict, gate: GateSpec) -> list[Check]:
    """Rejection rate and SLO goodput fraction; a summary without requests measures neither."""
    n = summary.get("requests") or 0
    out = []
    if gate.max_rejection_rate is not None:
        v = summary.get("status", {}).get("rejected", 0) / n if n else None
        out.append(Check("rejection_rate", v, gate.max_rejection_rate, v is None or v <= gate.max_rejection_rate + 1e-12))
    if gate.min_goodput_fraction is not None:
        v = summary.get("overall", {}).get("slo_met", 0) / n if n else None
        out.append(Check("goodput_fraction", v, gate.min_goodput_fraction,
                         v is None or v >= gate.min_goodput_fraction - 1e-12, ">="))
    return out


def verdict(checks: list[Check]) -> bool:
    return all(c.passed for c in checks)
