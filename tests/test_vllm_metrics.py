"""Reading vLLM's engine counters from its Prometheus exposition (the text format vLLM's
/metrics serves; tests/vllm reads a real server's)."""

from __future__ import annotations

import pytest

from tokenfair.integrations.vllm_metrics import EngineCounters, parse_counters

EXPOSITION = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="smollm2"} 2.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="smollm2"} 1200.0
# TYPE vllm:prompt_tokens_cached_total counter
vllm:prompt_tokens_cached_total{engine="0",model_name="smollm2"} 64.0
vllm:generation_tokens_total{engine="0",model_name="smollm2"} 300.0
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="smollm2"} 3.0
vllm:iteration_tokens_total_count{engine="0",model_name="smollm2"} 61.0
vllm:iteration_tokens_total_sum{engine="0",model_name="smollm2"} 1436.0
"""


def test_counters_are_read_by_name_and_summed_over_label_sets():
    two_engines = EXPOSITION + 'vllm:iteration_tokens_total_count{engine="1",model_name="smollm2"} 9.0\n'
    c = parse_counters(two_engines)
    assert c == EngineCounters(num_steps=70.0, num_step_tokens=1436.0, num_prompt_tokens=1200.0,
                               num_generation_tokens=300.0, num_preemptions=2.0)
    # prompt_tokens_cached_total and the histogram's buckets are other series, not summed in


def test_delta_is_the_work_between_two_readings():
    later = parse_counters(EXPOSITION.replace("} 61.0", "} 100.0").replace("} 300.0", "} 350.0"))
    d = later.delta(parse_counters(EXPOSITION))
    assert (d.num_steps, d.num_generation_tokens, d.num_prompt_tokens) == (39.0, 50.0, 0.0)


def test_a_missing_counter_is_named():
    text = "\n".join(ln for ln in EXPOSITION.splitlines() if "preemptions" not in ln)
    with pytest.raises(ValueError, match="vllm:num_preemptions_total.*--disable-log-stats"):
        parse_counters(text)
