"""A plugin whose import takes :data:`SECONDS`: a stand-in for a heavy verifier library (a
model to load, a large grammar to compile), so a test can tell warm-up from scoring time.

It registers no verifier. Every process that imports it pays the wait once: the
``rewardd score`` process (to validate plugin verifiers) and the pool's forkserver (whose
workers are forked with the module already imported).
"""

from __future__ import annotations

import time

SECONDS = 3.0

time.sleep(SECONDS)
