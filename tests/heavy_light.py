"""A two-tenant trace for the contract tests (gate, sweep): a heavy tenant that keeps the
engine busy and a light one whose requests a contract can starve."""

from __future__ import annotations

import json
from pathlib import Path


def write_heavy_light_trace(path: Path, num_heavy: int, num_light: int) -> Path:
    """``num_heavy`` requests of 3000 prompt / 400 output tokens every 0.25 s from 0 (tenant
    ``heavy``, ids ``h<k>``) and ``num_light`` of 200 / 50 every second from 0.5 s (``light``,
    ids ``l<k>``), in arrival order, as tokenfair JSONL at ``path``."""
    rows = [{"request_id": f"h{k}", "arrival_s": k * 0.25, "tenant": "heavy", "prompt_tokens": 3000,
             "output_tokens": 400} for k in range(num_heavy)]
    rows += [{"request_id": f"l{k}", "arrival_s": 0.5 + k, "tenant": "light", "prompt_tokens": 200,
              "output_tokens": 50} for k in range(num_light)]
    rows.sort(key=lambda r: r["arrival_s"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
