"""RealEngine driven by the real scheduler: the scheduler changes WHEN, never WHAT.

A tiny random Llama (conftest) replays a small multi-tenant trace with a small KV pool so
that chunked prefill, recompute and swap preemption all happen; greedy generations with
real prompts must equal each request generated alone, every request must end exactly once,
and the runner's free blocks must equal the scheduler pool's after every step.
"""

from __future__ import annotations

import json

import numpy as np
import torch
import pytest

from tokenfair.contracts.contract import Contract, EngineBudgets, PreemptionSpec
from tokenfair.engine.loader import build_model, load_hf_folder
from tokenfair.engine.offline import generate
from tokenfair.engine.sequence import GenerationPayload
from tokenfair.engine.setup import make_real_setup
from tokenfair.engine.replay import prepare_workload, run_real
from tokenfair.engine.buckets import decode_buckets
from tokenfair.engine.runner import ModelRunner, SeqWork
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.core.request import Status
from tokenfair.sched.baselines.fifo import FifoPolicy
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.workloads.workload import TraceRow, Workload

TENANTS = ("acme", "globex", "initech")


def _trace(n: int = 14, seed: int = 3, max_prompt: int = 40, max_output: int = 40
           ) -> tuple[Workload, dict[str, list[int]]]:
    rng = np.random.default_rng(seed)
    rows, prompts = [], {}
    for i in range(n):
        rid = f"r{i:02d}"
        p = int(rng.integers(3, max_prompt))
        o = int(rng.integers(3, max_output))
        prompts[rid] = rng.integers(3, 250, size=p).tolist()  # ids 0-2 are special in the tiny vocab
        rows.append(TraceRow(rid, round(0.002 * i, 6), TENANTS[i % 3], p, o))
    return Workload("tiny", tuple(rows)), prompts


def _contract(mode: str) -> Contract:
    return Contract(engine=EngineBudgets(prefill_token_budget=24, decode_token_budget=8, chunk_size=12,
                                         max_running=6, max_consecutive_prefill_steps=2),
                    preemption=PreemptionSpec(mode=mode, max_per_request=3, cooldown_s=0.0))


class StepClock:
    """Virtual time advancing a fixed 10 ms per step: runs are deterministic whatever the
    measured step times (the scheduler's decisions depend only on the trace)."""

    def start(self):
        return 0.0

    def now(self, t):
        return t

    def after_step(self, t, duration_s):
        return t + 0.01

    def idle_until(self, t, until):
        return max(t, until)


class _SwapFifo(FifoPolicy):
    def preempt_mode(self, req):
        return "swap"

    def can_admit(self, req, now, num_running):
        # Scheduler gap (reported): after a swap-in, _admit grows the request by one decode
        # token without checking the pool; keep one block spare for it here.
        if req.status is Status.SWAPPED and not req.in_prefill:
            return self.pool.blocks_for(req.num_computed + 1) <= self.pool.num_free
        return True


class _Checked(IterationScheduler):
    """Checks block accounting against the engine after every applied step."""

    engine = None
    checks = 0

    def update_from_output(self, out, result, now):
        ended = super().update_from_output(out, result, now)
        self.engine.check_blocks(self.pool)
        cache = self.engine.runner.cache
        cache.check_invariants()
        held = {r.request_id for r in self.running}
        assert set(cache._tables) == {r.request_id for r in self.running if r.num_computed} <= held
        self.checks += 1
        return ended


def _policy(name: str):
    if name == "swapfifo":
        return _SwapFifo()
    return make_policy(name)


@pytest.fixture(scope="module")
def loaded(tiny_llama):
    return load_hf_folder(tiny_llama[0])


@pytest.fixture(scope="module")
def trace_and_alone(loaded):
    wl, prompts = _trace()
    runner = ModelRunner(build_model(loaded), num_blocks=256, block_size=4)
    alone = {}
    for row in wl.rows:
        alone[row.request_id] = generate(runner, {row.request_id: prompts[row.request_id]}, row.output_tokens)[row.request_id]
    assert len({tuple(v) for v in alone.values()}) > len(alone) // 2  # not degenerate
    return wl, prompts, alone


def _replay(loaded, wl, prompts, policy, mode, num_blocks, block_size=4):
    payloads = {rid: GenerationPayload(list(p), ignore_eos=True) for rid, p in prompts.items()}
    contract = _contract(mode)
    prof, engine = make_real_setup(loaded, contract, num_blocks=num_blocks, block_size=block_size,
                                   payloads=payloads, keep_outputs=True, warmup=False)
    sched = _Checked(_policy(policy), contract, prof)
    sched.engine = engine
    res = run(wl.rows, contract, sched, engine, StepClock())
    return res, engine, sched, payloads


# KV pools sized so that every case preempts several times (fair needs a larger pool: it
# admits a prompt only when it fits whole within its tenant's share plus headroom).
@pytest.mark.parametrize("policy,mode,num_blocks", [("fifo", "recompute", 20), ("swapfifo", "swap", 20),
                                                    ("fair", "recompute", 30), ("fair", "swap", 30)])
def test_scheduler_changes_when_not_what(loaded, trace_and_alone, policy, mode, num_blocks):
    wl, prompts, alone = trace_and_alone
    res, engine, sched, payloads = _replay(loaded, wl, prompts, policy, mode, num_blocks)
    reqs = res.requests
    assert [r.request_id for r in reqs] == [r.request_id for r in wl.rows]
    assert all(r.status is Status.FINISHED for r in reqs), [(r.request_id, r.status, r.reason) for r in reqs]
    for row, r in zip(wl.rows, reqs):
        assert r.num_output == row.output_tokens
        assert payloads[r.request_id].output_ids == alone[r.request_id], r.request_id
        assert payloads[r.request_id].finish_reason == "length"
    # chunked prefill and preemption of the intended kind happened
    modes = {m for _, _, _, m in res.recorder.preemptions}
    assert sched.num_preemptions >= 3 and modes == {mode}, (sched.num_preemptions, modes)
    assert any(r.prompt_tokens > 12 for r in reqs)
    assert sched.checks == res.recorder.num_steps
    cache = engine.runner.cache
    assert cache.num_free_blocks == cache.num_blocks and cache.num_free_host_blocks == cache.num_host_blocks
    assert engine.num_active == 0 and engine.num_failed == 0


def test_synthetic_prompts_forced_length_and_seeded(loaded):
    wl, _ = _trace(n=8, seed=5)
    contract = _contract("recompute")
    outs = []
    for _ in range(2):
        prof, engine = make_real_setup(loaded, contract, num_blocks=20, block_size=4, keep_outputs=True,
                                       seed=7, warmup=False)
        sched = _Checked(make_policy("fifo"), contract, prof)
        sched.engine = engine
        res = run(wl.rows, contract, sched, engine, VirtualClock())
        assert all(r.status is Status.FINISHED for r in res.requests)
        assert [r.num_output for r in res.requests] == [row.output_tokens for row in wl.rows]
        assert all(len(engine.outputs[row.request_id]) == row.output_tokens for row in wl.rows)
        outs.append(engine.outputs)
    assert outs[0] == outs[1]
    prompt = engine.synthetic_prompt("r00", 50)
    assert len(prompt) == 50 and not {0, 1, 2} & set(prompt)  # no special tokens
    assert prompt == engine.synthetic_prompt("r00", 50) != engine.synthetic_prompt("r01", 50)


def test_max_tokens_caps_forced_length(loaded):
    rows = (TraceRow("a", 0.0, "t", 5, 9, max_tokens=3), TraceRow("b", 0.0, "t", 6, 1))
    contract = _contract("recompute")
    prof, engine = make_real_setup(loaded, contract, num_blocks=16, block_size=4, keep_outputs=True, warmup=False)
    sched = _Checked(make_policy("fifo"), contract, prof)
    sched.engine = engine
    res = run(rows, contract, sched, engine, VirtualClock())
    assert [(r.status, r.num_output) for r in res.requests] == [(Status.FINISHED, 3), (Status.FINISHED, 1)]
    assert [len(engine.outputs[k]) for k in "ab"] == [3, 1]


def test_runner_errors_fail_requests_instead_of_hanging(loaded):
    """Scheduler believes in 20 blocks, the runner has 6: requests fail with a reason."""
    wl, _ = _trace(n=6, seed=9)
    contract = _contract("recompute")
    prof, _ = make_real_setup(loaded, contract, num_blocks=20, block_size=4, warmup=False)
    _, engine = make_real_setup(loaded, contract, num_blocks=6, block_size=4, warmup=False)
    sched = IterationScheduler(make_policy("fifo"), contract, prof)
    res = run(wl.rows, contract, sched, engine, VirtualClock())
    statuses = [r.status for r in res.requests]
    assert all(s.is_terminal for s in statuses) and Status.FAILED in statuses
    for r in res.requests:
        if r.status is Status.FAILED:
            assert r.reason.startswith(("kv_cache_full", "engine_")), r.reason
    assert engine.runner.cache.num_free_blocks == 6 and engine.num_active == 0


def test_context_overflow_fails_with_reason(loaded):
    rows = (TraceRow("long", 0.0, "t", 250, 20), TraceRow("ok", 0.0, "t", 10, 4))
    contract = _contract("recompute")
    prof, engine = make_real_setup(loaded, contract, num_blocks=128, block_size=4, warmup=False)
    res = run(rows, contract, IterationScheduler(make_policy("fifo"), contract, prof), engine, VirtualClock())
    by_id = {r.request_id: r for r in res.requests}
    assert by_id["long"].status is Status.FAILED and "exceeds_model_context" in by_id["long"].reason
    assert by_id["ok"].status is Status.FINISHED and by_id["ok"].num_output == 4


def test_payload_stop_tokens_strings_and_streaming(loaded, trace_and_alone):
    wl, prompts, alone = trace_and_alone
    rid = next(k for k, v in alone.items() if len(v) >= 6)
    ref = alone[rid]
    stop_tok = ref[3]
    first = ref.index(stop_tok)
    streamed: list = []
    text_ref = loaded.decode(ref[: first + 1], skip_special_tokens=False)
    payloads = {
        "tok": GenerationPayload(list(prompts[rid]), max_new_tokens=50, stop_token_ids=(stop_tok,),
                                 on_token=lambda t, r: streamed.append((t, r))),
        "str": GenerationPayload(list(prompts[rid]), max_new_tokens=50, stop_strings=(text_ref[-2:],)),
        "len": GenerationPayload(list(prompts[rid]), max_new_tokens=5, stop_token_ids=()),
    }
    rows = tuple(TraceRow(k, 0.0, "t", len(prompts[rid]), 100) for k in payloads)
    contract = _contract("recompute")
    prof, engine = make_real_setup(loaded, contract, num_blocks=64, block_size=4, payloads=payloads, warmup=False)
    res = run(rows, contract, IterationScheduler(make_policy("fifo"), contract, prof), engine, VirtualClock())
    assert all(r.status is Status.FINISHED for r in res.requests)
    assert payloads["tok"].output_ids == ref[: first + 1] and payloads["tok"].finish_reason == "stop"
    assert [t for t, _ in streamed] == ref[: first + 1]
    assert [r for _, r in streamed] == [None] * first + ["stop"]
    s = payloads["str"]
    assert s.finish_reason == "stop" and len(s.output_ids) <= first + 1
    assert text_ref[-2:] in loaded.decode(s.output_ids, skip_special_tokens=False)
    assert payloads["len"].output_ids == generate(ModelRunner(build_model(loaded), 64, 4), {"x": prompts[rid]}, 5)["x"]
    assert payloads["len"].finish_reason == "length"


def test_prompt_length_mismatch_is_rejected(loaded):
    prof, engine = make_real_setup(loaded, None, num_blocks=8, block_size=4, warmup=False,
                                   payloads={"a": GenerationPayload([5, 6, 7])})
    rows = (TraceRow("a", 0.0, "t", 4, 2),)
    contract = _contract("recompute")
    with pytest.raises(ValueError, match="prompt ids"):
        run(rows, contract, IterationScheduler(make_policy("fifo"), contract, prof), engine, VirtualClock())


def test_run_real_writes_the_simulator_files(tiny_llama, tmp_path):
    wl, _ = _trace(n=10, seed=11)
    contract = _contract("recompute")
    out = run_real(wl, "fair", contract, str(tiny_llama[0]), out_dir=tmp_path, num_blocks=40, block_size=4,
                   num_threads=1, time_scale=2.0)
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == len(wl.rows)
    recs = [json.loads(x) for x in lines]
    assert {r["request_id"] for r in recs} == {r.request_id for r in wl.rows}
    assert all(r["status"] == "finished" for r in recs)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["engine"] == "real" and summary["requests"] == len(wl.rows)
    assert summary["kv_capacity_tokens"] == 160
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    assert timeline["num_steps"] > 0 and timeline["busy_s"] > 0
    # arrivals were stretched and really waited for
    assert recs[-1]["arrival_s"] == pytest.approx(2 * wl.rows[-1].arrival_s)
    assert all(r["first_token_s"] >= r["arrival_s"] for r in recs)
    assert out.profile.num_blocks == 40


def test_prepare_workload():
    wl, _ = _trace(n=10)
    p = prepare_workload(wl, max_requests=4, time_scale=3.0)
    assert len(p.rows) == 4 and p.rows[3].arrival_s == pytest.approx(3 * wl.rows[3].arrival_s)
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="time_scale must be finite and > 0"):
            prepare_workload(wl, time_scale=bad)


def test_runner_reorders_internally_but_answers_in_caller_order(loaded):
    """Decodes are sorted by context and bucketed inside the runner; sampled ids and kept
    logits still come back per sequence / in the caller's order, equal to stepping alone."""
    rng = np.random.default_rng(4)
    prompts = {s: rng.integers(3, 250, size=n).tolist() for s, n in (("long", 70), ("short", 3), ("mid", 20))}
    batched = ModelRunner(build_model(loaded), num_blocks=64, block_size=4, keep_logits=True)
    for s, p in prompts.items():
        batched.step([SeqWork(s, p, 0, True)])
    fresh = rng.integers(3, 250, size=9).tolist()
    batch = [SeqWork("new", fresh, 0, True)] + [SeqWork(s, [7], len(p), True) for s, p in prompts.items()]
    out = batched.step(batch)
    assert len(decode_buckets(torch.tensor([4, 8, 74, 75]), torch.tensor([True] * 4), batched.cache.block_size)) == 2
    for row, work in enumerate(batch):
        alone = ModelRunner(build_model(loaded), num_blocks=64, block_size=4, keep_logits=True)
        if work.seq_id != "new":
            alone.step([SeqWork(work.seq_id, prompts[work.seq_id], 0, True)])
        ref = alone.step([work])
        torch.testing.assert_close(out.logits[row], ref.logits[0], atol=1e-4, rtol=1e-4)
        assert out.sampled[work.seq_id] == ref.sampled[work.seq_id]
