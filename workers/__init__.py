"""Executors: where verifier calls run.

* :class:`rewardd.workers.embedded.EmbeddedExecutor` (default): a local pool of killable processes.
* :class:`rewardd.workers.distributed.CeleryExecutor` (``REWARDD_BROKER_URL`` set): Celery queues
  on Redis, served by ``rewardd worker`` processes (:mod:`rewardd.workers.celery_app`), with queues
  per kind of verifier (:mod:`rewardd.workers.routing`); it composes a publisher, a result
  collector, a worker census and a fleet watchdog (:mod:`rewardd.workers.distributed`).

Both run the same task functions (:mod:`rewardd.workers.tasks`) under the same limits and map every
failure to the same typed outcomes.
"""

from rewardd.workers.executor import CallResult, Executor, ItemResult, VerifyCall

__all__ = ["CallResult", "Executor", "ItemResult", "VerifyCall"]
