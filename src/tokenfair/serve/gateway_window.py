"""The gateway's per-backend state (:class:`Backend`); its window's rules are
:mod:`tokenfair.sched.backend_window` (pure, shared with the fleet simulator), whose
``WindowConfig`` and ``AdaptiveWindow`` stay importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sched.backend_window import AdaptiveWindow, WindowConfig

__all__ = ["AdaptiveWindow", "WindowConfig", "Backend", "normalize_backend_url"]


@dataclass
class Backend:
    url: str                          # base URL ending in /v1
    window: AdaptiveWindow
    name: str = ""
    up: bool = True
    next_probe_s: float = 0.0
    probe_backoff_s: float = 0.5
    inflight: int = 0
    inflight_tokens: int = 0
    ttft_ewma_s: float | None = None
    tpot_ewma_s: float | None = None
    served: int = 0
    errors: int = 0
    models: list[str] = field(default_factory=list)

    def room(self) -> int:
        return self.window.limit - self.inflight


def normalize_backend_url(url: str) -> str:
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise ValueError(f"backend {url!r}: expected an http(s):// URL")
    return u if u.endswith("/v1") else u + "/v1"
