"""Progress for long runs: one line per phase (loading, each transform, verifying, each export) on
stderr once a run has taken more than a few seconds — by time, not by graph size: a 1,800-node
Keras ResNet50 verified at 224×224 takes as long as a 20,000-node graph. Quick runs stay quiet
(the lines go to DEBUG, shown with ``-v``); ``-q`` silences them.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

log = logging.getLogger("tfsurgery")
AFTER_SECONDS = 2.0           # a run this old says what it is doing
_started: Optional[float] = None


def start() -> None:
    """A new run (the CLI's command, or an API call that is not part of one)."""
    global _started
    _started = time.monotonic()


def say(message: str) -> None:
    """A phase begins: INFO once the run is older than AFTER_SECONDS, else DEBUG."""
    if _started is None:
        start()
    elapsed = time.monotonic() - _started
    log.log(logging.INFO if elapsed > AFTER_SECONDS else logging.DEBUG,
            "[%5.1f s] %s", elapsed, message)
