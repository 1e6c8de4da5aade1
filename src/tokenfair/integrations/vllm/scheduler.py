"""The scheduler classes vLLM builds with ``--scheduler-cls``: vLLM's own scheduler with its
waiting queue replaced by :class:`~.queue.PolicyQueue` and a few values set before each step
(module docstring of :mod:`.bridge`).

``TokenfairScheduler`` extends ``vllm.v1.core.sched.scheduler.Scheduler``;
``TokenfairAsyncScheduler`` extends ``AsyncScheduler`` (for ``--async-scheduling``).  The
overrides only wrap the base methods: vLLM's mechanics run unchanged.
"""

from __future__ import annotations

import logging

from .compat import check_request, check_scheduler, check_vllm_version

check_vllm_version()                # before vLLM's internals are imported: fail with the versions

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.request_queue import SchedulingPolicy  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from ... import core_build  # noqa: E402
from .bridge import PolicyBridge  # noqa: E402
from .queue import PolicyQueue  # noqa: E402
from .settings import load_settings  # noqa: E402
from .steplog import StepLog  # noqa: E402
from .urgent import preempt_for_urgent  # noqa: E402

log = logging.getLogger("tokenfair.vllm")


def _init(sched) -> None:
    """The tokenfair state of a freshly built vLLM scheduler."""
    check_scheduler(sched)
    cfg = sched.scheduler_config
    base_budget = int(sched.max_num_scheduled_tokens)
    base_threshold = int(cfg.long_prefill_token_threshold or 0)
    settings = load_settings(getattr(sched.vllm_config, "additional_config", None) or {},
                             max_running=int(sched.max_num_running_reqs), token_budget=base_budget,
                             chunk_cap=base_threshold, num_blocks=int(sched.cache_config.num_gpu_blocks),
                             block_size=int(sched.block_size))
    sched.tokenfair = PolicyBridge(settings)
    sched.tokenfair_base_budget = base_budget
    sched.tokenfair_steps = StepLog(settings.steps_path) if settings.steps_path else None
    sched.waiting = PolicyQueue(sched.tokenfair, lambda: len(sched.running))
    # the victim vLLM evicts for KV is max(priority, arrival) in priority mode; the bridge
    # sets each running request's priority to its victim rank before every step
    sched.policy = SchedulingPolicy.PRIORITY
    log.warning("tokenfair scheduler: policy %s, contract %s (%s), profile %s, step budget %d tokens, "
                "chunk %d, max running %d, %s", settings.policy, settings.contract_path,
                settings.contract.content_hash, settings.profile.name, base_budget,
                settings.contract.engine.chunk_size, settings.contract.engine.max_running,
                core_build.describe())


def _before_schedule(sched) -> None:
    bridge: PolicyBridge = sched.tokenfair
    free = int(sched.kv_cache_manager.block_pool.get_num_free_blocks())
    for req, reason in bridge.policy.expire(bridge.clock()):
        sched.waiting.expire(req, reason)
    prefill_budget = bridge.before_step(sched.running, free)
    preempt_for_urgent(sched, bridge.clock())       # a blocked urgent head evicts the policy's victim
    num_decodes = sum(1 for r in sched.running if r.num_computed_tokens >= r.num_prompt_tokens)
    sched.max_num_scheduled_tokens = max(1, min(sched.tokenfair_base_budget, num_decodes + prefill_budget))
    sched.scheduler_config.long_prefill_token_threshold = max(1, min(bridge.contract.engine.chunk_size,
                                                                     prefill_budget))
    sched.waiting.begin_step()


def _fail_pending(sched) -> None:
    """Requests the policy rejected or expired end with an error output in this step's
    ``update_from_output`` (vLLM's own path for requests it fails)."""
    ids = sched.waiting.take_failing()
    if ids:
        sched.grammar_compile_error_reqs.update(ids)


def _tokenfair_class(base: type, name: str, doc: str) -> type:
    """``base`` (vLLM's Scheduler or AsyncScheduler) with the tokenfair hooks around its
    methods; each override calls the base method unchanged."""

    def __init__(self, *args, **kwargs) -> None:
        base.__init__(self, *args, **kwargs)
        _init(self)

    def add_request(self, request) -> None:
        check_request(request)
        base.add_request(self, request)

    def schedule(self, *args, **kwargs):
        steps: StepLog | None = self.tokenfair_steps
        if steps is not None:
            steps.begin()
        _before_schedule(self)
        out = base.schedule(self, *args, **kwargs)
        if steps is not None:
            steps.scheduled()
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        _fail_pending(self)
        outputs = base.update_from_output(self, scheduler_output, model_runner_output)
        self.tokenfair.after_step(scheduler_output.num_scheduled_tokens)
        if self.tokenfair_steps is not None and scheduler_output.total_num_scheduled_tokens:
            self.tokenfair_steps.end(self, scheduler_output)
        return outputs

    def finish_requests(self, request_ids, finished_status):
        done = base.finish_requests(self, request_ids, finished_status)
        bridge: PolicyBridge = self.tokenfair
        now = bridge.clock()
        for vreq in done:
            req = bridge.by_id.get(vreq.request_id)
            if req is not None:
                bridge.finish(req, now)
        return done

    methods = {"__init__": __init__, "add_request": add_request, "schedule": schedule,
               "update_from_output": update_from_output, "finish_requests": finish_requests,
               "__doc__": doc, "__module__": __name__, "__qualname__": name}
    return type(name, (base,), methods)


TokenfairScheduler = _tokenfair_class(
    Scheduler, "TokenfairScheduler",
    "vLLM's scheduler with tokenfair's policy deciding order, admission, budget and victims.")
TokenfairAsyncScheduler = _tokenfair_class(
    AsyncScheduler, "TokenfairAsyncScheduler", "The same for vLLM's AsyncScheduler (--async-scheduling).")
