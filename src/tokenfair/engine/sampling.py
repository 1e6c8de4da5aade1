"""Token sampling: greedy, temperature and nucleus (top-p), with per-request seeds.

Invariants: ``temperature == 0`` means greedy (argmax, no randomness consumed); every
non-greedy request draws from its OWN ``torch.Generator`` (seeded from ``seed`` when
given), so a request's samples do not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams()


def sample_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """Sample one token per row of ``logits`` ``[S, vocab]``.

    Greedy rows use argmax; the other rows are tempered, top-p filtered and sampled by
    inverse-CDF with one uniform draw from that row's generator (batched apart from the draw).
    """
    logits = logits.detach().float().cpu()  # [S, vocab] is small; sampling runs on the host
    chosen = logits.argmax(dim=-1)
    random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if random_rows:
        rows = torch.tensor(random_rows)
        temperatures = torch.tensor([params[i].temperature for i in random_rows], dtype=torch.float32)
        top_ps = torch.tensor([params[i].top_p for i in random_rows], dtype=torch.float32)
        probs = torch.softmax(logits[rows].float() / temperatures[:, None], dim=-1)
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = torch.where(mass_before < top_ps[:, None], sorted_probs, 0.0)
        cdf = sorted_probs.cumsum(dim=-1)
        draws = torch.cat([torch.rand(1, generator=generators[i]) for i in random_rows])
        picks = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None], right=True).squeeze(1)
        picks = picks.clamp(max=cdf.shape[-1] - 1)
        chosen[rows] = sorted_ids.gather(1, picks[:, None]).squeeze(1)
    return chosen.tolist()


def make_generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator
