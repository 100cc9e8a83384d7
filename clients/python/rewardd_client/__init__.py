"""rewardd-client: the light client of rewardd and ready adapters for trainers.

Depends on httpx and msgpack only (orjson, numpy and torch are used when installed); it never
imports the server, so a trainer installs it alone: ``pip install ./clients/python``.
"""

from __future__ import annotations

from rewardd_client.client import AsyncRewarddClient, RewarddClient, RewarddError

__all__ = ["AsyncRewarddClient", "RewarddClient", "RewarddError"]
__version__ = "0.1.0"
