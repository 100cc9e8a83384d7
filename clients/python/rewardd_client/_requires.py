"""What an adapter needs beyond the client, and the error that says how to get it.

The client depends on httpx and msgpack only, so that a trainer installs it anywhere; each
adapter's own needs are an extra of the distribution (``pip install 'rewardd-client[verl]'``,
``[trl]``, ``[openrlhf]``, ``[slime]``), which lists what that adapter imports and never the
trainer itself (a user installs a trainer their own way, often from source; an extra that
named it could pull or upgrade it).

When such an import fails the adapter raises :class:`MissingDependency`, whose message starts
with the missing package's name and ends with the command that installs it. Why a message of
our own instead of Python's ``No module named 'aiohttp'``: that line does not say which extra
brings the package, and where the trainer itself imports the adapter (verl loads
``rewardd_client.verl_plugin`` as a plugin and logs a failure at debug level only) it was not
shown at all; a user saw ``Unknown advantage estimator simply: rewardd`` instead.
:func:`announce` logs the message at ERROR for that case, so it is seen whatever the trainer
does with the exception.
"""

from __future__ import annotations

import importlib
import logging
from typing import Sequence

__all__ = ["MissingDependency", "announce", "missing_dependency", "require"]

_LOG = logging.getLogger("rewardd_client")


class MissingDependency(ImportError):
    """An adapter cannot load for want of a package. ``name`` is the missing module (as on
    any ImportError), ``extra`` the extra that installs it, ``command`` the pip command."""

    def __init__(self, message: str, *, name: str | None, extra: str, command: str) -> None:
        super().__init__(message, name=name)
        self.extra = extra
        self.command = command


def missing_dependency(exc: ImportError, *, adapter: str, extra: str,
                       trainer: str | None = None, trainer_version: str = "") -> MissingDependency:
    """The :class:`MissingDependency` for ``exc`` raised while ``adapter`` imported its needs.

    A package of the extra is named with the extra's pip command. The trainer itself
    (``trainer``, which no extra installs) is named with its own command; a module missing
    *inside* the trainer means another release of it (``trainer_version`` says which works).
    """
    name = exc.name or str(exc)
    top = name.split(".")[0]
    command = f"pip install 'rewardd-client[{extra}]'"
    if trainer is not None and top == trainer and name != trainer:
        command = f"pip install '{trainer}{trainer_version}'"
        message = (f"'{name}' is missing from the installed {trainer}: {adapter} needs "
                   f"{trainer}{trainer_version} ({exc}); {command}")
    elif trainer is not None and top == trainer:
        command = f"pip install {trainer} && {command}"
        message = f"'{trainer}' is not installed, and {adapter} runs inside it: {command}"
    else:
        message = (f"'{top}' is not installed, and {adapter} needs it ({exc}); "
                   f"install what the adapter needs with: {command}")
    return MissingDependency(message, name=exc.name, extra=extra, command=command)


def require(modules: Sequence[str], *, adapter: str, extra: str) -> None:
    """Import each of ``modules`` now, so a missing one fails when the adapter is set up
    (with :class:`MissingDependency`), not midway through the first training step."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise missing_dependency(exc, adapter=adapter, extra=extra) from exc


def announce(error: MissingDependency) -> MissingDependency:
    """Log ``error`` at ERROR level and return it, for a module that its trainer imports and
    whose import errors the trainer hides (verl's plugin loader logs them at debug level)."""
    _LOG.error("%s", error)
    return error
