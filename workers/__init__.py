"""Executors: where verifier calls run (embedded process pools now, Celery queues later)."""

from workers.executor import CallResult, Executor, VerifyCall

__all__ = ["CallResult", "Executor", "VerifyCall"]
