"""The server's start-up heap, kept out of the garbage collector's full collections.

A full (generation 2) collection scans every tracked object of the process, and runs on
whichever thread allocates when it falls due -- mostly the event loop.  ``serve`` holds
torch, transformers, the tokenizer and the app: a full scan of that heap took 0.23-0.30 s
on the loop (``tokenfair.serve.loop_lag``'s ``gc`` field, 2 shared cores under load), a
gap in every stream.  ``tokenfair serve`` and ``tokenfair gateway`` call
:func:`freeze_startup_heap` once the service is built, before the server starts
(cli/serve.py; never a server run inside another program, e.g. the tests): everything
alive then goes to the collector's permanent generation (:func:`gc.freeze`), and later
full collections scan only what requests left behind.  Frozen objects are still freed by
reference counting; only cycles among them are never collected (start-up objects live as
long as the process anyway).
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect once, then freeze what is left; the number of objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
