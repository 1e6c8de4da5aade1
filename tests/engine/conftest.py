"""Fixtures for engine tests: a tiny random Llama saved as a local HF folder.

Weights come from a seeded local ``torch.Generator`` (never the global RNG), scaled so
that logits have clear margins and greedy argmax is not decided by float noise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a paged kv cache stores keys and values in fixed size blocks",
    "fair scheduling shares tokens between tenants 0123456789",
    "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n",
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    return tokenizer


def _randomise(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(0.15 * torch.randn(param.shape, generator=generator))


def make_tiny_llama(folder: Path, tie_embeddings: bool, seed: int = 1234):
    """Save a tiny random LlamaForCausalLM (+ tokenizer.json) to ``folder``; return the HF model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _build_tokenizer(300)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=500.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    _randomise(model, seed)
    if tie_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """(folder, hf_model) for an untied tiny Llama."""
    folder = tmp_path_factory.mktemp("tiny_llama")
    return folder, make_tiny_llama(folder, tie_embeddings=False)


@pytest.fixture(scope="session")
def tiny_llama_tied(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_llama_tied")
    return folder, make_tiny_llama(folder, tie_embeddings=True, seed=99)


def hf_greedy(hf_model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy ``generate`` with EOS stopping disabled."""
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="session")
def hf_reference():
    return hf_greedy
