"""A request's own fault fails that request alone: the others in its steps get exactly the
tokens they get alone, and the KV pools stay consistent (runner == scheduler pool)."""

from __future__ import annotations

import pytest
import torch

from tokenfair.contracts.contract import Contract, EngineBudgets, PreemptionSpec
from tokenfair.engine.loader import build_model, load_hf_folder
from tokenfair.engine.offline import generate
from tokenfair.engine.sequence import GenerationPayload
from tokenfair.engine.setup import make_real_setup
from tokenfair.engine.runner import ModelRunner
from tokenfair.engine.sampling import InvalidSamplingError, SamplingParams
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.core.request import Status
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.workloads.workload import TraceRow

PROMPTS = {f"r{i}": [3 + (7 * i + k) % 200 for k in range(6 + i)] for i in range(6)}
NEW = 6


@pytest.fixture(scope="module")
def loaded(tiny_llama):
    return load_hf_folder(tiny_llama[0])


@pytest.fixture(scope="module")
def alone(loaded):
    runner = ModelRunner(build_model(loaded), num_blocks=256, block_size=4)
    return {rid: generate(runner, {rid: p}, NEW)[rid] for rid, p in PROMPTS.items()}


def _contract() -> Contract:
    return Contract(engine=EngineBudgets(prefill_token_budget=64, decode_token_budget=8, chunk_size=32, max_running=8),
                    preemption=PreemptionSpec(mode="recompute", max_per_request=3, cooldown_s=0.0))


def _run(loaded, payloads, patch=None):
    contract = _contract()
    prof, engine = make_real_setup(loaded, contract, num_blocks=64, block_size=4, payloads=payloads, warmup=False)
    if patch is not None:
        patch(engine.runner)
    sched = IterationScheduler(make_policy("fifo"), contract, prof)
    rows = tuple(TraceRow(rid, 0.0, f"t{i % 3}", len(p.prompt_ids), 100) for i, (rid, p) in enumerate(payloads.items()))
    res = run(rows, contract, sched, engine, VirtualClock())
    engine.runner.cache.check_invariants()
    assert engine.runner.cache.num_free_blocks == engine.runner.cache.num_blocks   # everything freed
    return {r.request_id: r for r in res.requests}, engine


def _payloads(extra: dict[str, GenerationPayload] | None = None) -> dict[str, GenerationPayload]:
    out = {rid: GenerationPayload(list(p), max_new_tokens=NEW, ignore_eos=True) for rid, p in PROMPTS.items()}
    out.update(extra or {})
    return out


def test_seed_outside_the_generator_range_is_refused_with_its_field():
    with pytest.raises(InvalidSamplingError) as err:
        SamplingParams(temperature=1.0, seed=18446744073709551617)
    assert err.value.param == "seed" and "[-2^63, 2^64)" in str(err.value)
    for bad in ({"temperature": float("nan")}, {"top_p": float("inf")}, {"temperature": -1.0}):
        with pytest.raises(InvalidSamplingError):
            SamplingParams(**bad)
    SamplingParams(temperature=1.0, seed=-(2 ** 63))
    SamplingParams(temperature=1.0, seed=2 ** 64 - 1)


def test_a_bad_seed_that_slips_through_fails_only_its_request(loaded, alone):
    bad = SamplingParams(temperature=1.0)
    object.__setattr__(bad, "seed", 18446744073709551617)      # past the validation, as a bug would
    reqs, engine = _run(loaded, _payloads({"poison": GenerationPayload([5, 6, 7, 8], sampling=bad, max_new_tokens=NEW)}))
    assert reqs["poison"].status is Status.FAILED and reqs["poison"].reason.startswith("invalid_sampling:")
    for rid in PROMPTS:
        assert reqs[rid].status is Status.FINISHED, reqs[rid].reason
        assert engine.payloads[rid].output_ids == alone[rid]


def test_a_step_that_raises_is_retried_without_the_request_that_caused_it(loaded, alone):
    def patch(runner):
        real_step = runner.step

        def step(batch):
            if any(w.seq_id == "poison" for w in batch):
                raise RuntimeError("boom from the poisoned request")
            return real_step(batch)
        runner.step = step

    reqs, engine = _run(loaded, _payloads({"poison": GenerationPayload([5, 6, 7, 8], max_new_tokens=NEW)}), patch)
    assert reqs["poison"].status is Status.FAILED
    assert reqs["poison"].reason == "request_fault: RuntimeError: boom from the poisoned request"
    assert engine.num_retried_steps > 0
    for rid in PROMPTS:
        assert reqs[rid].status is Status.FINISHED, reqs[rid].reason
        assert engine.payloads[rid].output_ids == alone[rid]


def test_nan_logits_fail_only_their_request(loaded, alone):
    marker = next(t for t in range(250, 3, -1) if all(t not in v for v in alone.values())
                  and all(t not in p for p in PROMPTS.values()))

    def patch(runner):
        model = runner.model
        real_forward = model.forward

        def forward(token_ids, positions, pool, metadata, logits_indices, *a, **kw):
            logits = real_forward(token_ids, positions, pool, metadata, logits_indices, *a, **kw)
            fed = token_ids[logits_indices] if logits_indices is not None else token_ids
            logits = logits.clone()
            logits[fed == marker] = float("nan")
            return logits
        model.forward = forward

    reqs, engine = _run(loaded, _payloads({"poison": GenerationPayload([5, 6, 7, marker], max_new_tokens=NEW)}), patch)
    assert reqs["poison"].status is Status.FAILED and reqs["poison"].reason.startswith("non_finite_logits:")
    for rid in PROMPTS:
        assert reqs[rid].status is Status.FINISHED, reqs[rid].reason
        assert engine.payloads[rid].output_ids == alone[rid]


def test_a_streaming_callback_error_fails_only_its_request(loaded, alone):
    def explode(token, reason):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "broken tokenizer")

    reqs, engine = _run(loaded, _payloads({"poison": GenerationPayload([5, 6, 7, 8], max_new_tokens=NEW,
                                                                       on_token=explode)}))
    assert reqs["poison"].status is Status.FAILED and reqs["poison"].reason.startswith("request_error:")
    for rid in PROMPTS:
        assert reqs[rid].status is Status.FINISHED
        assert engine.payloads[rid].output_ids == alone[rid]


def test_non_finite_rows_are_named():
    from tokenfair.engine.runner import SeqWork

    logits = torch.zeros(3, 5)
    logits[1, 2] = float("inf")
    items = [SeqWork(f"s{i}", [1], 0, True) for i in range(3)]
    assert list(ModelRunner._non_finite_rows(logits, items)) == ["s1"]
    assert ModelRunner._non_finite_rows(torch.zeros(3, 5), items) == {}
