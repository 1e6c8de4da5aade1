"""Greedy generations of the engine must EQUAL transformers' greedy ``generate``."""

from __future__ import annotations

import pytest
import torch

from tokenfair.engine.loader import build_model, load_hf_folder
from tokenfair.engine.offline import OfflineGenerator, generate
from tokenfair.engine.runner import ModelRunner, SeqWork
from tokenfair.engine.sampling import SamplingParams

TEXTS = [
    "the quick brown fox",
    "a",
    "fair scheduling shares tokens between tenants and the lazy dog jumps over 42 blocks",
    "paged kv cache",
    "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n",
]
NEW_TOKENS = 12


def _runner(folder, num_blocks=64, block_size=4, **kwargs) -> ModelRunner:
    loaded = load_hf_folder(folder)
    return ModelRunner(build_model(loaded), num_blocks=num_blocks, block_size=block_size, **kwargs)


@pytest.fixture(scope="module")
def prompts(tiny_llama):
    loaded = load_hf_folder(tiny_llama[0])
    encoded = {f"s{i}": loaded.encode(text) for i, text in enumerate(TEXTS)}
    lengths = sorted(len(p) for p in encoded.values())
    assert lengths[0] == 1 and lengths[-1] > 20, lengths
    assert len(encoded["s4"]) > 3 and loaded.encode("<|im_start|>") == [1]
    return encoded


@pytest.fixture(scope="module")
def expected(tiny_llama, prompts, hf_reference):
    hf_model = tiny_llama[1]
    out = {seq_id: hf_reference(hf_model, p, NEW_TOKENS) for seq_id, p in prompts.items()}
    # Guard against a degenerate model where "equal" would be trivial.
    assert len({tuple(v) for v in out.values()}) == len(out)
    assert all(len(set(v)) > 2 for v in out.values())
    return out


def test_loaded_config_matches_hf(tiny_llama):
    folder, hf_model = tiny_llama
    config = load_hf_folder(folder).config
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 2, 16)
    assert config.rope_theta == 500.0 and not config.tie_embeddings


def test_prefill_logits_match_hf(tiny_llama, prompts):
    folder, hf_model = tiny_llama
    runner = _runner(folder, keep_logits=True)
    batch = [SeqWork(seq_id, p, 0, sample=True) for seq_id, p in prompts.items()]
    out = runner.step(batch)
    assert out.num_tokens == sum(len(p) for p in prompts.values())
    for row, (seq_id, p) in enumerate(prompts.items()):
        with torch.no_grad():
            ref = hf_model(torch.tensor([p])).logits[0, -1]
        torch.testing.assert_close(out.logits[row], ref, atol=2e-4, rtol=1e-4)
        assert out.sampled[seq_id] == int(ref.argmax())


def test_single_sequence_matches_hf(tiny_llama, prompts, expected):
    runner = _runner(tiny_llama[0])
    for seq_id, prompt in prompts.items():
        got = generate(runner, {seq_id: prompt}, NEW_TOKENS)
        assert got[seq_id] == expected[seq_id], seq_id
    runner.cache.check_invariants()
    assert runner.cache.num_free_blocks == runner.cache.num_blocks


@pytest.mark.parametrize("prefill_chunk,max_step_tokens", [(512, 2048), (3, 2048), (5, 7), (1, 4)])
def test_batched_mixed_and_chunked_prefill(tiny_llama, prompts, expected, prefill_chunk, max_step_tokens):
    runner = _runner(tiny_llama[0])
    driver = OfflineGenerator(runner, prefill_chunk=prefill_chunk, max_step_tokens=max_step_tokens)
    for seq_id, prompt in prompts.items():
        driver.add(seq_id, prompt, NEW_TOKENS)
    assert driver.run() == {k: expected[k] for k in prompts}
    if prefill_chunk < 512:  # some step must mix unfinished prefill chunks with sampling work
        assert any(0 < len(out.sampled) < out.num_seqs for out in driver.step_outputs)
    runner.cache.check_invariants()
    assert runner.cache.num_free_blocks == runner.cache.num_blocks


def test_staggered_arrivals_mix_prefill_with_decode(tiny_llama, prompts, expected):
    runner = _runner(tiny_llama[0])
    driver = OfflineGenerator(runner, prefill_chunk=4)
    items = list(prompts.items())
    driver.add(*items[0], NEW_TOKENS)
    for seq_id, prompt in items[1:]:
        driver.step()  # earlier sequences are decoding while the new one prefills
        driver.add(seq_id, prompt, NEW_TOKENS)
    assert driver.run() == expected
    assert any(1 < out.num_seqs < out.num_tokens for out in driver.step_outputs)


def test_recompute_preemption_mid_generation(tiny_llama, prompts, expected):
    runner = _runner(tiny_llama[0])
    driver = OfflineGenerator(runner, prefill_chunk=6)
    for seq_id, prompt in prompts.items():
        driver.add(seq_id, prompt, NEW_TOKENS)
    victims = ["s2", "s0"]
    while min(len(driver.seqs[v].generated) for v in victims) < 3:
        driver.step()
    assert all(0 < len(driver.seqs[v].generated) < NEW_TOKENS for v in victims)
    for victim in victims:
        driver.preempt_recompute(victim)
        assert runner.cache.num_tokens(victim) == 0
    runner.cache.check_invariants()
    assert driver.run() == expected


def test_swap_out_in_mid_generation(tiny_llama, prompts, expected):
    runner = _runner(tiny_llama[0], num_host_blocks=32)
    driver = OfflineGenerator(runner, prefill_chunk=8)
    for seq_id, prompt in prompts.items():
        driver.add(seq_id, prompt, NEW_TOKENS)
    victim = "s2"
    while len(driver.seqs[victim].generated) < 2:
        driver.step()
    held_blocks = len(runner.cache.block_table(victim))
    out_stats = driver.preempt_swap(victim)
    assert out_stats.bytes_moved == held_blocks * runner.cache.bytes_per_block > 0
    assert out_stats.seconds >= 0
    # Others keep generating (and reuse the freed blocks) while the victim is on the host.
    for _ in range(3):
        driver.step()
    # Clobber every free device block so a missing copy-back would corrupt the result.
    free_blocks = torch.tensor(runner.cache.free_block_ids())
    runner.cache.pool[:, :, free_blocks] = 1e3
    in_stats = driver.resume_swap(victim)
    assert in_stats.bytes_moved == out_stats.bytes_moved
    runner.cache.check_invariants()
    assert driver.run() == expected


def test_tied_embeddings_match_hf(tiny_llama_tied, hf_reference):
    folder, hf_model = tiny_llama_tied
    loaded = load_hf_folder(folder)
    assert loaded.config.tie_embeddings and "lm_head.weight" not in loaded.state_dict
    prompt = loaded.encode("the lazy dog and the quick fox")
    runner = ModelRunner(build_model(loaded), num_blocks=16, block_size=8)
    assert generate(runner, {"x": prompt}, 10, prefill_chunk=3)["x"] == hf_reference(hf_model, prompt, 10)


def test_step_rejects_out_of_order_positions(tiny_llama, prompts):
    runner = _runner(tiny_llama[0])
    with pytest.raises(ValueError):
        runner.step([SeqWork("s0", prompts["s0"], start_pos=3, sample=True)])
    runner.cache.check_invariants()
    assert runner.cache.num_free_blocks == runner.cache.num_blocks


def test_seeded_sampling_independent_of_batch_and_recompute(tiny_llama, prompts):
    hot = SamplingParams(temperature=1.0, top_p=0.95, seed=11)
    alone = generate(_runner(tiny_llama[0]), {"s0": prompts["s0"]}, NEW_TOKENS, sampling=hot)["s0"]
    runner = _runner(tiny_llama[0], seed=5)
    driver = OfflineGenerator(runner, prefill_chunk=3)
    for seq_id, prompt in prompts.items():
        driver.add(seq_id, prompt, NEW_TOKENS, hot if seq_id == "s0" else SamplingParams(temperature=1.0))
    while len(driver.seqs["s0"].generated) < 4:
        driver.step()
    driver.preempt_recompute("s0")
    assert driver.run()["s0"] == alone
    other = generate(_runner(tiny_llama[0]), {"s0": prompts["s0"]}, NEW_TOKENS, sampling=SamplingParams(temperature=1.0, seed=12))
    assert other != alone
