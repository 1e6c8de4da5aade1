"""tokenfair's HTTP service: OpenAI-compatible ``serve`` (scheduler + PyTorch engine) and
``gateway`` (fair queueing in front of N backends) modes, and the ``load`` generator.

Modules: ``app`` (routes, FastAPI) with ``service``, ``jobs``, ``parsing``, ``sse``, ``errors``
(the shared HTTP layer), ``openai_schema`` (request/response models), ``auth`` (API key ->
tenant), ``metrics`` (Prometheus), ``engine_backend`` + ``engine_worker`` + ``engine_job``
(serve mode), ``gateway`` + ``gateway_jobs`` + ``gateway_health`` + ``gateway_dispatch`` +
``gateway_backend`` + ``gateway_window`` (gateway mode), ``load`` (load generator), ``shutdown`` (graceful shutdown,
in-process servers), ``fake_backend`` (deterministic FIFO backend for tests and benchmarks),
``overhead`` (gateway latency benchmark).  See docs/SERVICE.md.  Import submodules
directly; this package imports nothing heavy.
"""
