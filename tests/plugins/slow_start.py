"""A plugin whose import takes :data:`SECONDS`: a stand-in for a heavy verifier library (a
model to load, a large grammar to compile), so a test can tell warm-up from scoring time.

It registers no verifier. Every process that imports it pays the wait once: the
``rewardd score`` process (to validate plugin verifiers) and the pool's forkserver (whose
workers are forked with the module already imported). Where ``SLOW_START_LOG`` names a file,
each import appends its process id there once its wait is over, so a test can check *when*
the imports ended against what it sees of the command (its progress bar), not how long
anything took.
"""

from __future__ import annotations

import os
import time

SECONDS = 3.0

time.sleep(SECONDS)
if log := os.environ.get("SLOW_START_LOG"):
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()}\n")
