"""vLLM's own engine counters, read from its Prometheus endpoint (``GET /metrics``).

A step of vLLM's engine costs a fixed part plus a part per prefill token (docs/BENCHMARKS.md,
from the plugin's step log), so for the same requests the number of engine steps and the
prefill tokens computed say whether a scheduler used the engine as well as another did,
without timing anything.  ``EngineCounters`` holds the counters that matter for that;
``delta`` gives the work between two readings.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from ..serve.prometheus_text import sum_series

# metric name in vLLM's exposition -> EngineCounters field
COUNTERS = {
    "vllm:iteration_tokens_total_count": "num_steps",        # one observation per engine step with output
    "vllm:iteration_tokens_total_sum": "num_step_tokens",    # prefill tokens computed + tokens generated
    "vllm:prompt_tokens_total": "num_prompt_tokens",
    "vllm:generation_tokens_total": "num_generation_tokens",
    "vllm:num_preemptions_total": "num_preemptions",
}
METRICS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EngineCounters:
    num_steps: float = 0.0              # >= 0, monotone over a server's life
    num_step_tokens: float = 0.0        # >= num_generation_tokens
    num_prompt_tokens: float = 0.0
    num_generation_tokens: float = 0.0
    num_preemptions: float = 0.0

    def delta(self, earlier: "EngineCounters") -> "EngineCounters":
        return EngineCounters(**{f: getattr(self, f) - getattr(earlier, f) for f in COUNTERS.values()})


def parse_counters(text: str) -> EngineCounters:
    """Sum each counter over its label sets (one engine: one set).  A counter vLLM did not
    export raises ValueError naming it."""
    sums = sum_series(text, frozenset(COUNTERS))
    missing = [name for name in COUNTERS if name not in sums]
    if missing:
        raise ValueError(f"vLLM /metrics has no {', '.join(missing)}: is the server started "
                         "without --disable-log-stats?")
    return EngineCounters(**{field: sums[name][0] for name, field in COUNTERS.items()})


def read_counters(url: str) -> EngineCounters:
    r = httpx.get(url.rstrip("/") + "/metrics", timeout=METRICS_TIMEOUT_S)
    r.raise_for_status()
    return parse_counters(r.text)
