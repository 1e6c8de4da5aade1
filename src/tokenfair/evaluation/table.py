"""The side-by-side table of a policy comparison: one plain row per policy (the terminal and
HTML tables show the same numbers), and its fixed-width text form."""

from __future__ import annotations


def table_rows(summaries: dict[str, dict], verdicts: dict[str, bool] | None = None) -> list[dict]:
    """One plain row per policy: the numbers the terminal and HTML tables show."""
    rows = []
    for policy, s in summaries.items():
        worst_t, worst = None, None
        for t, m in s.get("tenants", {}).items():
            v = m["ttft_s"]["p99"]
            if v is not None and (worst is None or v > worst):
                worst_t, worst = t, v
        if verdicts is not None and policy in verdicts:
            verdict = "pass" if verdicts[policy] else "fail"
        elif "gate" in s:
            verdict = "pass" if s["gate"]["passed"] else "fail"
        else:
            verdict = "-"
        status = s.get("status", {})
        good = s.get("goodput", {})
        rows.append({
            "policy": policy, "throughput": s.get("throughput_tokens_per_s"),
            "finished_tokens": good.get("finished_tokens"), "in_time_tokens": good.get("in_time_tokens"),
            "longest_gap_s": s.get("longest_service_gap_s"),
            "rejected_by_reason": ", ".join(f"{st[:3]}.{code} {n}" for st, codes in s.get("outcomes", {}).items()
                                            for code, n in codes.items()),
            "jain_min": s.get("fairness", {}).get("jain_min"), "starvation": s.get("starvation_events", 0),
            "worst_tenant": worst_t, "worst_ttft_p99_s": worst,
            "max_slowdown": s.get("overall", {}).get("slowdown", {}).get("max"),
            "preemptions": s.get("preemptions", 0),
            "recovery_pct": 100.0 * s.get("recovery_cost_fraction", 0.0),
            "rejected": status.get("rejected", 0) + status.get("expired", 0),
            "verdict": verdict,
        })
    return rows


def compare_table(summaries: dict[str, dict]) -> str:
    """A fixed-width text table, one row per policy."""
    def f(v, fmt):
        return "-" if v is None else fmt.format(v)
    head = (f"{'policy':<10}{'tok/s':>9}{'finished':>11}{'in time':>11}{'jain min':>9}{'starve':>8}"
            f"{'max gap':>9}{'worst P99 TTFT':>22}{'max slowdn':>11}{'preempt':>9}{'recov %':>8}"
            f"{'rej/exp':>8}{'verdict':>9}")
    lines = [head, "-" * len(head)]
    for r in table_rows(summaries):
        worst = "-" if r["worst_ttft_p99_s"] is None else f"{r['worst_ttft_p99_s']:.2f}s ({str(r['worst_tenant'])[:10]})"
        lines.append(f"{r['policy'][:10]:<10}{f(r['throughput'], '{:.0f}'):>9}"
                     f"{f(r['finished_tokens'], '{:.0f}'):>11}{f(r['in_time_tokens'], '{:.0f}'):>11}"
                     f"{f(r['jain_min'], '{:.3f}'):>9}{r['starvation']:>8}{f(r['longest_gap_s'], '{:.1f}s'):>9}{worst:>22}{f(r['max_slowdown'], '{:.1f}'):>11}{r['preemptions']:>9}"
                     f"{f(r['recovery_pct'], '{:.2f}'):>8}{r['rejected']:>8}{r['verdict']:>9}")
    reasons = [f"{r['policy']}: {r['rejected_by_reason']}" for r in table_rows(summaries) if r["rejected_by_reason"]]
    if reasons:
        lines.append("not finished, by reason: " + "; ".join(reasons))
    return "\n".join(lines)
