"""The look-ahead that the wait forecast and the in-queue order share.

A forecast extrapolates the present load over a request's max wait ``M``.  It sheds only when
that horizon reaches at most ``SHED_LOOKAHEAD_S`` (``L``) past the spell its tenant has been
backlogged: a request that arrives while the spell is shorter than ``M - L`` is never shed
for its forecast (``forecast.py``), and is a *burst* request to the in-queue order
(``class_queue.py``).
"""

from __future__ import annotations

from typing import Final

# a forecast sheds only if its horizon (the max wait) reaches at most this far past the
# tenant's backlog spell
SHED_LOOKAHEAD_S: Final = 60.0


def spell_allows_shedding(spell_s: float, max_wait_s: float) -> bool:
    """A backlog spell of ``spell_s`` is long enough for a forecast over ``max_wait_s``."""
    return spell_s >= max_wait_s - SHED_LOOKAHEAD_S
