"""The plugin's logger and call counters (``stats()``), shared by its modules."""

from __future__ import annotations

import collections
import logging

logger = logging.getLogger("localargmax.integrations.vllm")

STATS: collections.Counter[str] = collections.Counter()


def fallback(reason: str) -> None:
    """Count a call that runs vLLM's own method, and log each reason once at WARNING."""
    key = "fallback: " + reason
    if key not in STATS:
        logger.warning(
            "localargmax: vLLM's own LogitsProcessor method runs for %s (logged once per reason; "
            "localargmax.integrations.vllm.stats() counts the calls)",
            reason,
        )
    STATS[key] += 1
