"""One process asks rewardd, every process gets the answer or the same error.

The advantages hook (:mod:`rewardd_client._trl_advantages`) sends its requests from the main
process alone: a stateful estimator (``ha_dw``, ``ucb_curriculum``) must see each batch once,
and one request for the gathered batch costs less than one per process. The other processes
wait on accelerate's ``broadcast_object_list``; if the main process raised and broadcast
nothing, they would wait forever. So the main process always broadcasts: the value, or what
went wrong, and every process raises the same error.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from rewardd_client.errors import RewarddError

__all__ = ["on_main_process"]

T = TypeVar("T")


def on_main_process(accelerator: Any, compute: Callable[[], T], what: str) -> T:
    """``compute()`` on the main process, its value on every process. A
    :class:`~rewardd_client.errors.RewarddError` raised there is raised on every process as
    the same class with the same status and detail; any other exception is raised as it is on
    the main process and as a ``RuntimeError`` naming it (and ``what``) on the others."""
    from accelerate.utils import broadcast_object_list

    payload: list[Any] = [None]
    failure: Exception | None = None
    if accelerator.is_main_process:
        try:
            payload = [("ok", compute())]
        except RewarddError as exc:  # the other processes raise the same class
            failure, payload = exc, [("rewardd", (type(exc), exc.status, exc.detail))]
        except Exception as exc:
            failure, payload = exc, [("failed", f"{type(exc).__name__}: {exc}")]
    status, value = broadcast_object_list(payload)[0]
    if failure is not None:
        raise failure
    if status == "rewardd":
        kind, code, detail = value
        raise kind(code, detail)
    if status == "failed":
        raise RuntimeError(f"rewardd {what}: the main process's request failed: {value}")
    return value
