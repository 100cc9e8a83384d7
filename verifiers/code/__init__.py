"""The ``code`` verifier: run the completion's program on the reference's tests in a sandbox.

Pipeline: :mod:`~rewardd.verifiers.code.extract` finds the program (the last fenced block of the
task's language, else the whole completion); :mod:`~rewardd.verifiers.code.spec` reads the reference
into test runs (stdin/stdout, function calls, assert-style test code lifted into expressions)
and expected answers; :mod:`~rewardd.verifiers.code.sandbox` runs the program (the runs only: the
expected answers never enter it; :mod:`~rewardd.verifiers.code.types` is the boundary's data);
:mod:`~rewardd.verifiers.code.compare` judges each result as plain data, outside;
:mod:`~rewardd.verifiers.code.verifier` ties them together into a reward and a per-test ``detail``.

``CodeVerifier`` and ``CodeParams`` are imported lazily (on first attribute access), so the
sandbox's own modules can import ``rewardd.verifiers.code.types`` without pulling in the verifier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rewardd.verifiers.code.verifier import CodeParams, CodeVerifier

__all__ = ["CodeParams", "CodeVerifier"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rewardd.verifiers.code import verifier

        return getattr(verifier, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
