"""Sampling: greedy is argmax, seeds reproduce, top-p restricts support, and a
request's samples do not depend on its batch neighbours."""

from __future__ import annotations

import pytest
import torch

from tokenfair.engine.sampling import SamplingParams, make_generator, sample_tokens


def _logits(num_rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = _logits(4)
    assert sample_tokens(logits, [SamplingParams()] * 4, [None] * 4) == logits.argmax(-1).tolist()


def test_seeded_sampling_reproducible_and_batch_independent():
    logits = _logits(3)
    hot = SamplingParams(temperature=1.0)
    alone = sample_tokens(logits[1:2], [hot], [make_generator(7)])[0]
    batched = sample_tokens(logits, [hot] * 3, [make_generator(1), make_generator(7), make_generator(3)])
    assert batched[1] == alone

    def run(seed: int) -> list[int]:
        generator = make_generator(seed)
        return [sample_tokens(logits[:1], [hot], [generator])[0] for _ in range(20)]

    assert run(5) == run(5) and len(set(run(5))) > 1 and run(5) != run(6)


def test_top_p_restricts_support():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    params = SamplingParams(temperature=1.0, top_p=0.7)
    gen = make_generator(0)
    seen = {sample_tokens(logits, [params], [gen])[0] for _ in range(300)}
    assert seen == {0, 1}
    gen = make_generator(0)
    seen_all = {sample_tokens(logits, [SamplingParams(temperature=1.0)], [gen])[0] for _ in range(300)}
    assert seen_all == {0, 1, 2, 3}


def test_mixed_greedy_and_random_rows():
    logits = _logits(4, seed=3)
    params = [SamplingParams(), SamplingParams(temperature=0.7, seed=1), SamplingParams(), SamplingParams(temperature=2.0)]
    out = sample_tokens(logits, params, [None, make_generator(1), None, make_generator(2)])
    assert out[0] == int(logits[0].argmax()) and out[2] == int(logits[2].argmax())


def test_invalid_params():
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
