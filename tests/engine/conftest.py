"""Fixtures for engine tests: a tiny random Llama saved as a local HF folder
(``tests/tiny_model.py``), untied and tied, and transformers' greedy generation."""

from __future__ import annotations


import pytest
import torch
from tiny_model import make_tiny_llama

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
