"""One JSON line per vLLM step (``tokenfair_steps`` / ``TOKENFAIR_STEPS``): what the step
ran and how long it took, to see where a policy's decisions cost throughput.

Each line: ``t`` (monotonic, when ``schedule`` began), ``schedule_ms`` (tokenfair's hooks and
vLLM's ``schedule``), ``step_ms`` (``schedule`` to the end of ``update_from_output``: the
model runs in between), ``running`` / ``waiting`` (after scheduling), ``reqs`` / ``tokens``
(scheduled), ``prefills`` / ``prefill_tokens`` (requests scheduled with more than one token
or not yet past their prompt), ``new`` (admitted this step), ``preempted``, ``budget`` and
``chunk`` (the token budget and chunk the bridge set) and ``tenants`` (running, per tenant).
Off by default; a debugging aid, not a metric.
"""

from __future__ import annotations

import json
import time
from collections import Counter


class StepLog:
    def __init__(self, path: str) -> None:
        self.file = open(path, "a", encoding="utf-8", buffering=1)
        self.started_s = 0.0
        self.scheduled_s = 0.0

    def begin(self) -> None:
        self.started_s = time.monotonic()

    def scheduled(self) -> None:
        self.scheduled_s = time.monotonic()

    def end(self, sched, output) -> None:
        """After ``update_from_output``: one line for the step ``output`` described."""
        now = time.monotonic()
        tokens = output.num_scheduled_tokens
        prefills = num_prefill_tokens = 0
        for rid, n in tokens.items():
            vreq = sched.requests.get(rid)
            if n > 1 or (vreq is not None and int(vreq.num_computed_tokens) - n < int(vreq.num_prompt_tokens)):
                prefills += 1
                num_prefill_tokens += n
        bridge = sched.tokenfair
        tenants = Counter(bridge.by_id[v.request_id].tenant for v in sched.running if v.request_id in bridge.by_id)
        row = {"t": round(self.started_s, 4), "schedule_ms": round(1000 * (self.scheduled_s - self.started_s), 2),
               "step_ms": round(1000 * (now - self.started_s), 2), "running": len(sched.running),
               "waiting": len(sched.waiting), "reqs": len(tokens), "tokens": int(output.total_num_scheduled_tokens),
               "prefills": prefills, "prefill_tokens": num_prefill_tokens, "new": len(output.scheduled_new_reqs),
               "preempted": len(output.preempted_req_ids or ()), "budget": int(sched.max_num_scheduled_tokens),
               "chunk": int(sched.scheduler_config.long_prefill_token_threshold or 0), "tenants": dict(tenants)}
        self.file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self.file.close()
