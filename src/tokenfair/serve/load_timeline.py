"""The timeline of a load run, from client-side token times: the same schema as
:meth:`tokenfair.runtime.recorder.Recorder.to_json`, so ``metrics.summarize`` computes the
same fairness metrics for ``tokenfair load`` as for ``simulate``."""

from __future__ import annotations

from collections import defaultdict

from ..contracts.contract import Contract


def build_timeline(records: list[dict], stamps_of: dict[str, list[float]], contract: Contract,
                   bucket_s: float = 1.0) -> dict:
    """Recorder.to_json()-shaped timeline from client-side token times (1 s buckets): the
    prompt's cost at the first token, one decode cost per streamed text chunk at its
    arrival, and output tokens beyond the chunk count (``usage``) at the finish."""
    wp, wd = contract.costs.prefill_token, contract.costs.decode_token
    ts: dict = defaultdict(lambda: defaultdict(float))
    cs: dict = defaultdict(lambda: defaultdict(float))
    tokens: dict = defaultdict(int)
    running: dict = defaultdict(int)
    for r in records:
        if r["first_token_s"] is None:
            continue
        b0 = int(r["first_token_s"] // bucket_s)
        ts[r["tenant"]][b0] += wp * r["prompt_tokens"]
        cs[r["class"]][b0] += wp * r["prompt_tokens"]
        tokens[b0] += r["prompt_tokens"]
        stamps = list(stamps_of.get(r["request_id"], ()))[: r["output_tokens"]]
        stamps += [r["finish_s"]] * (r["output_tokens"] - len(stamps))
        for t in stamps:
            b = int(t // bucket_s)
            ts[r["tenant"]][b] += wd
            cs[r["class"]][b] += wd
            tokens[b] += 1
        t1 = r["finish_s"]
        for b in range(int(r["arrival_s"] // bucket_s), int(t1 // bucket_s) + 1):
            running[b] += 1
    span = max((r["finish_s"] for r in records if r["finish_s"] is not None), default=0.0)
    return {
        "bucket_s": bucket_s,
        "tenant_service": {t: dict(sorted(v.items())) for t, v in ts.items()},
        "class_service": {c: dict(sorted(v.items())) for c, v in cs.items()},
        "tokens": dict(sorted(tokens.items())),
        "queue_len": {}, "running": dict(sorted(running.items())), "kv_usage": {}, "preemptions": [],
        "num_steps": 0, "busy_s": span, "swap_s": 0.0,
    }
