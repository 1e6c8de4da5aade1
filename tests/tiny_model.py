"""A tiny random Llama saved as a local HF folder, for the engine and service tests.

Weights come from a seeded local ``torch.Generator`` (never the global RNG), scaled so that
logits have clear margins and greedy argmax is not decided by float noise.  torch,
tokenizers and transformers are imported when a model is made, not with this module.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a paged kv cache stores keys and values in fixed size blocks",
    "fair scheduling shares tokens between tenants 0123456789",
    "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n",
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 300


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE tokenizer trained on :data:`CORPUS`."""
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


def randomise(model, seed: int) -> None:
    """Norm weights ~ 1 + 0.1 N(0, 1), every other parameter ~ 0.15 N(0, 1), in name order."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(0.15 * torch.randn(param.shape, generator=generator))


def make_tiny_llama(folder: Path, tie_embeddings: bool = False, seed: int = 1234):
    """Save a tiny random LlamaForCausalLM (+ tokenizer.json, max 256 positions) to ``folder``;
    return the HF model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
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
    randomise(model, seed)
    if tie_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return model
