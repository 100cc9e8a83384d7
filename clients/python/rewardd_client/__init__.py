"""rewardd-client: the light client of rewardd and ready adapters for trainers.

Depends on httpx and msgpack only (orjson, numpy and torch are used when installed); it never
imports the server, so a trainer installs it alone: ``pip install ./clients/python``.
"""

from __future__ import annotations

from rewardd_client.client import AsyncRewarddClient, RewarddClient
from rewardd_client.errors import (ConnectionFailed, FieldError, InvalidRequest, JobFailed,
                                   NotFound, PayloadTooLarge, RateLimited, RewarddError,
                                   ServerError, TooBusy, Unauthorized, Unavailable)
from rewardd_client.jobs import JobEvent
from rewardd_client.retry import RetryEvent, RetryPolicy

__all__ = ["AsyncRewarddClient", "ConnectionFailed", "FieldError", "InvalidRequest",
           "JobEvent", "JobFailed", "NotFound", "PayloadTooLarge", "RateLimited",
           "RetryEvent", "RetryPolicy", "RewarddClient", "RewarddError", "ServerError",
           "TooBusy", "Unauthorized", "Unavailable"]
__version__ = "0.1.0"
