"""Writing a run's results: requests.jsonl, summary.json, timeline.json, and the terminal table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from ..evaluation.record_table import RecordTable


def write_run(out_dir: str | Path, records: RecordTable | Iterable[dict], summary: dict, timeline: dict) -> Path:
    """``records``: a :class:`RecordTable` (written a chunk at a time) or the dicts."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    with (d / "requests.jsonl").open("w") as fh:
        if isinstance(records, RecordTable):
            records.write_jsonl(fh)
        else:
            for rec in records:
                fh.write(json.dumps(rec) + "\n")
    (d / "summary.json").write_text(json.dumps(summary, indent=2, default=_jsonable))
    (d / "timeline.json").write_text(json.dumps(timeline, default=_jsonable))
    return d


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _f(v, scale=1.0, fmt="{:.3f}"):
    return "-" if v is None else fmt.format(v * scale)


def summary_table(summary: dict) -> str:
    lines = [f"policy={summary['policy']}  workload={summary['workload']}  profile={summary['profile']}  "
             f"contract={summary['contract_version']}@{summary['contract_hash']}",
             f"requests={summary['requests']} status={summary['status']}  "
             f"throughput={summary['throughput_tokens_per_s']:.0f} tok/s  "
             f"finished={summary.get('finished_tokens', 0):,} tok  "
             f"in_time={summary.get('goodput', {}).get('in_time_tokens', 0):,} tok  "
             f"not_finished={summary.get('outcomes') or '-'}  "
             f"jain_min={_f(summary['fairness']['jain_min'])}  starvation={summary['starvation_events']}  "
             f"preemptions={summary['preemptions']}  recovery={summary['recovery_cost_fraction']:.2%}",
             f"{'tenant':<16}{'reqs':>7}{'ttft p50':>10}{'ttft p99':>10}{'tpot p99':>10}{'e2e p99':>10}"
             f"{'max wait':>10}{'slowdown':>10}{'starve':>8}"]
    for t, m in summary["tenants"].items():
        lines.append(f"{t[:15]:<16}{m['requests']:>7}{_f(m['ttft_s']['p50']):>10}{_f(m['ttft_s']['p99']):>10}"
                     f"{_f(m['tpot_s']['p99']):>10}{_f(m['e2e_s']['p99']):>10}{_f(m['max_wait_s']):>10}"
                     f"{_f(m['slowdown'].get('p50')):>10}{m['starvation_events']:>8}")
    return "\n".join(lines)
