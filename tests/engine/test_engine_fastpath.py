"""The runner's fast paths change speed, not results: fused / oneDNN-prepacked projections
match the plain per-projection model, and decode stages (K/V kept contiguous across steps)
give bit-identical logits to gathering the paged blocks every step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tokenfair.engine import stages as runner_module  # where the stage constants live
from tokenfair.engine.buckets import prefill_buckets
from tokenfair.engine.loader import build_model, load_hf_folder
from tokenfair.engine.model import PackedLinear, mkl_packed_linear_works
from tokenfair.engine.offline import OfflineGenerator
from tokenfair.engine.runner import ModelRunner, SeqWork

TEXTS = ["the quick brown fox", "a", "fair scheduling shares tokens between tenants and the lazy dog",
         "paged kv cache", "<|im_start|>user\nhello there<|im_end|>\n"]

KINDS = ["plain", "transposed"] + (["mkl"] if mkl_packed_linear_works() else [])


@pytest.fixture(scope="module")
def loaded(tiny_llama):
    return load_hf_folder(tiny_llama[0])


@pytest.fixture(scope="module")
def prompts(loaded):
    return {f"s{i}": loaded.encode(t) for i, t in enumerate(TEXTS)}


def test_mkl_packing_is_used_on_this_cpu():
    # torch ships MKL on x86 CPUs; if this fails the engine silently runs the slower layout
    assert mkl_packed_linear_works()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [0, 1, 2, 7, 40, 300])
def test_packed_linear_matches_f_linear(kind, rows):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(48, 24, generator=g)
    x = torch.randn(rows, 24, generator=g)
    layer = PackedLinear(weight, kind)
    assert (layer.mkl_packed is not None) == (kind == "mkl")
    torch.testing.assert_close(layer(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    # a strided input (a column slice of a wider buffer) as the fused MLP produces
    wide = torch.randn(rows, 48, generator=g)
    torch.testing.assert_close(layer(wide[:, :24]), F.linear(wide[:, :24], weight), rtol=1e-5, atol=1e-5)


def _logits_over_generation(loaded, prompts, kind: str | None, new_tokens: int = 6):
    model = build_model(loaded)
    if kind is not None:
        model.optimize_for_inference(kind)
        assert all(layer.mlp.gate_up.kind == kind for layer in model.layers)
    runner = ModelRunner(model, num_blocks=64, block_size=4, keep_logits=True, optimize=False)
    driver = OfflineGenerator(runner, prefill_chunk=5)
    for seq_id, prompt in prompts.items():
        driver.add(seq_id, prompt, new_tokens)
    generated = driver.run()
    return generated, [out.logits for out in driver.step_outputs]


@pytest.mark.parametrize("kind", KINDS)
def test_fused_projections_give_the_unfused_logits_and_tokens(loaded, prompts, kind):
    plain_tokens, plain_logits = _logits_over_generation(loaded, prompts, None)
    fused_tokens, fused_logits = _logits_over_generation(loaded, prompts, kind)
    assert fused_tokens == plain_tokens
    assert len(fused_logits) == len(plain_logits)
    for a, b in zip(fused_logits, plain_logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # float32 rounding only


def _lockstep(loaded, prompts, monkeypatch):
    """Run the same schedule (staggered arrivals, chunked prefill, a recompute, a swap,
    finishes) on a staged and an unstaged runner; return both drivers' step outputs."""
    monkeypatch.setattr(runner_module, "STAGE_HEADROOM", 5)  # stages outgrow their capacity often
    drivers = []
    for staged in (True, False):
        runner = ModelRunner(build_model(loaded), num_blocks=64, block_size=4, num_host_blocks=32,
                             keep_logits=True, stage_decode=staged)
        drivers.append(OfflineGenerator(runner, prefill_chunk=4))
    items = list(prompts.items())
    appended = regrown = 0
    swapped = None

    def running():
        return [k for k, s in drivers[0].seqs.items() if not s.finished and not s.swapped and s.num_fed > 0]

    for i in range(120):
        if i < len(items):
            for d in drivers:
                d.add(items[i][0], items[i][1], 30 if i % 2 else 22)
        if i == 8:
            victim = running()[0]
            for d in drivers:
                d.preempt_recompute(victim)
        if i == 11:
            swapped = running()[-1]
            for d in drivers:
                d.preempt_swap(swapped)
        if i == 14:
            for d in drivers:
                d.resume_swap(swapped)
        if not drivers[0].has_work():
            break
        before = dict(drivers[0].runner.stages.live)
        for d in drivers:
            d.step()
        after = drivers[0].runner.stages.live
        appended += sum(st is before.get(ids) for ids, st in after.items())
        regrown += sum(ids in before and st is not before[ids] for ids, st in after.items())
        assert not drivers[1].runner.stages.live
    return drivers, appended, regrown


def test_decode_stage_is_bit_identical_to_gathering_blocks(loaded, prompts, monkeypatch):
    (staged, plain), appended, regrown = _lockstep(loaded, prompts, monkeypatch)
    assert appended >= 3 and regrown >= 1, (appended, regrown)  # kept stages appended to, and outgrown
    assert {k: s.generated for k, s in staged.seqs.items()} == {k: s.generated for k, s in plain.seqs.items()}
    assert len(staged.step_outputs) == len(plain.step_outputs)
    for a, b in zip(staged.step_outputs, plain.step_outputs):
        assert a.sampled == b.sampled
        assert torch.equal(a.logits, b.logits)
    staged.runner.cache.check_invariants()


def test_stage_starts_on_a_steady_group_and_is_dropped_when_a_member_leaves(loaded, prompts):
    runner = ModelRunner(build_model(loaded), num_blocks=64, block_size=4, stage_decode=True)
    ids = ["s0", "s2", "s3"]
    out = runner.step([SeqWork(s, prompts[s], 0, True) for s in ids])
    last = dict(out.sampled)
    pos = {s: len(prompts[s]) for s in ids}

    def decode(order):
        o = runner.step([SeqWork(s, [last[s]], pos[s], True) for s in order])
        for s in order:
            last[s] = o.sampled[s]
            pos[s] += 1

    for _ in range(runner_module.STAGE_AFTER - 1):
        decode(ids)
        assert not runner.stages.live  # a group that just formed gathers its blocks; no stage yet
    decode(ids)
    (first,) = runner.stages.live.values()  # the same group STAGE_AFTER steps running: staged
    decode(ids)
    assert list(runner.stages.live.values()) == [first]  # and appended to in place
    decode(ids[::-1])  # the runner orders decodes by context: the caller's order does not matter
    assert list(runner.stages.live.values()) == [first]
    first_buffers = {id(t) for t in first._flat}
    for _ in range(runner_module.STAGE_AFTER - 1):  # a member sits out: another group, staged later
        decode(ids[:2])
        assert not runner.stages.live
        assert {id(t) for t in runner.stages.spares.spare} == first_buffers  # kept for reuse
    decode(ids[:2])
    (second,) = runner.stages.live.values()
    assert {id(t) for t in second._flat} == first_buffers and not runner.stages.spares.spare  # reused, not new
    runner.recompute("s2")
    assert not runner.stages.live  # a member's KV was dropped: its stage goes too
    pos["s2"] = 0
    runner.step([SeqWork("s2", prompts["s2"] + [0] * 3, 0, False)])
    pos["s2"] = len(prompts["s2"]) + 3
    decode(ids)
    assert all(st.lens.tolist() == [pos[s] for s in st.seq_ids] for st in runner.stages.live.values())


def test_prefill_rows_are_bucketed_so_padding_stays_small():
    # decodes (q == 1) are not prefill rows; the last row is a chunk over cached context
    q = torch.tensor([1, 514, 713, 105, 6, 1, 300, 300, 20])
    k = torch.tensor([40, 514, 713, 105, 6, 90, 300, 300, 60])
    buckets = prefill_buckets(q, k, q == 1)
    assert sorted(i for b in buckets for i in b.tolist()) == [1, 2, 3, 4, 6, 7, 8]  # each exactly once
    groups = {frozenset(b.tolist()) for b in buckets}
    assert {frozenset({1}), frozenset({2}), frozenset({3}), frozenset({6, 7}), frozenset({4, 8})} == groups
    for b in buckets:  # padded query-key pairs over the rows' own: at most 64 x 64
        padded = len(b) * int(q[b].max()) * int(k[b].max())
        assert padded - int((q[b] * k[b]).sum()) <= 64 * 64


def test_whole_prompts_attend_causally_to_their_own_keys(loaded):
    gen = torch.Generator().manual_seed(0)
    prompts = {f"p{n}_{i}": torch.randint(3, loaded.config.vocab_size, (n,), generator=gen).tolist()
               for i, n in enumerate([120, 80, 80, 20])}
    runner = ModelRunner(build_model(loaded), num_blocks=128, block_size=4, keep_logits=True)
    seen = []
    prepare = runner._prepare
    runner._prepare = lambda batch: seen.append(prepare(batch)) or seen[-1]
    out = runner.step([SeqWork(s, p, 0, True) for s, p in prompts.items()])
    groups = seen[0][2].groups
    assert [int(g.query_valid.shape[0]) for g in groups] == [1, 2, 1]  # 120 | 80, 80 | 20
    assert all(g.causal and g.mask.numel() == 0 for g in groups)
    # the same prompts after a one-token cached prefix take the masked gather path
    masked = ModelRunner(build_model(loaded), num_blocks=128, block_size=4, keep_logits=True)
    masked.step([SeqWork(s, p[:1], 0, False) for s, p in prompts.items()])
    seen.clear()
    masked._prepare = lambda batch: seen.append(prepare.__func__(masked, batch)) or seen[-1]
    ref = masked.step([SeqWork(s, p[1:], 1, True) for s, p in prompts.items()])
    assert not any(g.causal for g in seen[0][2].groups)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-5)
    assert out.sampled == ref.sampled
