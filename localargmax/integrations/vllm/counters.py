"""The plugin's logger and call counters (``stats()``), shared by its modules."""

from __future__ import annotations

import collections
import logging

logger = logging.getLogger("localargmax.integrations.vllm")

STATS: collections.Counter[str] = collections.Counter()


def fallback(reason: str, *, key: str = "fallback: ", what: str = "LogitsProcessor method", unit: str = "calls"):
    """Count a call (or step) that runs vLLM's own ``what`` under ``key + reason``, and log each reason once at
    WARNING."""
    key += reason
    if key not in STATS:
        logger.warning(  # the reason is the record's one argument (tests read it from there)
            f"localargmax: vLLM's own {what} runs for %s (logged once per reason; "
            f"localargmax.integrations.vllm.stats() counts the {unit})",
            reason,
        )
    STATS[key] += 1
