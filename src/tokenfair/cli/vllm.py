"""``tokenfair bench vllm``: real vLLM with and behind tokenfair (integrations/vllm_bench.py)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .common import fail


def bench_vllm(model: Path = typer.Option(..., help="Hugging Face model folder (scripts/vllm-setup.sh prints it)"),
               repeats: int = typer.Option(3, help="alternated runs per side (medians)"),
               streams: int = typer.Option(16, help="closed-loop streams for gateway vs direct"),
               per_stream: int = typer.Option(3, help="requests per stream"),
               logs: Path = typer.Option(Path("reports/bench-vllm"), help="vLLM logs and records here"),
               part: str = typer.Option("gateway,plugin", help="which comparisons: gateway, plugin"),
               max_prefill_backlog: int = typer.Option(None, help="the gateway's --max-prefill-backlog "
                                                       "(default: the gateway's; 0: no bound)"),
               compare_backlog: str = typer.Option("", help="comma-separated --max-prefill-backlog values: "
                                                   "one more gateway each, alternated with the others"),
               out: Path = typer.Option(None, help="write the JSON result here too")) -> None:
    """Gateway vs direct (16 streams; light tenant under a heavy burst) and the tokenfair
    scheduler vs stock vLLM (heavy burst + light tenant), each alone in turn, medians."""
    if not (model / "config.json").exists():
        fail(f"--model {model}: not a Hugging Face model folder (run scripts/vllm-setup.sh)")
    if repeats < 1 or streams < 1 or per_stream < 1:
        fail("--repeats, --streams and --per-stream must be >= 1")
    if max_prefill_backlog is not None and max_prefill_backlog < 0:
        fail(f"--max-prefill-backlog {max_prefill_backlog}: give prompt tokens >= 0 (0: no bound)")
    from ..integrations.vllm_bench import PARTS, bench_vllm as run
    parts = tuple(p.strip() for p in part.split(",") if p.strip())
    if not parts or any(p not in PARTS for p in parts):
        fail(f"--part {part!r}: give a comma-separated subset of {', '.join(PARTS)}")
    try:
        backlogs = tuple(int(v) for v in compare_backlog.split(",") if v.strip())
    except ValueError:
        fail(f"--compare-backlog {compare_backlog!r}: give comma-separated prompt-token counts, e.g. 0,1024")
    if any(n < 0 for n in backlogs):
        fail(f"--compare-backlog {compare_backlog!r}: counts must be >= 0 (0: no bound)")
    gateway_args = () if max_prefill_backlog is None else ("--max-prefill-backlog", str(max_prefill_backlog))
    result = run(str(model), logs, repeats=repeats, streams=streams, per_stream=per_stream, parts=parts,
                 gateway_args=gateway_args, compare_backlogs=backlogs)
    text = json.dumps(result, indent=2)
    if out is not None:
        out.write_text(text + "\n")
    typer.echo(text)
