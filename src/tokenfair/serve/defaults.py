"""Service defaults the CLI shows without importing the HTTP stack (no imports here)."""

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024   # 4 MiB: ~1M tokens of text, far past any context here
DEFAULT_GRACE_S = 20.0                      # + CLOSE_S = 25 s < Kubernetes' default 30 s before SIGKILL
CLOSE_S = 5.0                               # uvicorn's time to close connections after the grace period
