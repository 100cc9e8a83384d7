"""Executors: where verifier calls run (embedded process pools now, Celery queues later)."""

from workers.executor import CallResult, Executor, ItemResult, VerifyCall

__all__ = ["CallResult", "Executor", "ItemResult", "VerifyCall"]
