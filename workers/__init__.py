"""Executors: where verifier calls run.

* :class:`workers.embedded.EmbeddedExecutor` (default): a local pool of killable processes.
* :class:`workers.distributed.CeleryExecutor` (``REWARDD_BROKER_URL`` set): Celery queues
  on Redis, served by ``rewardd worker`` processes (:mod:`workers.celery_app`), with queues
  per kind of verifier (:mod:`workers.routing`).

Both run the same task functions (:mod:`workers.tasks`) under the same limits and map every
failure to the same typed outcomes.
"""

from workers.executor import CallResult, Executor, ItemResult, VerifyCall

__all__ = ["CallResult", "Executor", "ItemResult", "VerifyCall"]
