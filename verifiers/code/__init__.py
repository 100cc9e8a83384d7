"""The ``code`` verifier: run the completion's program on the reference's tests in a sandbox.

Pipeline: :mod:`~rewardd.verifiers.code.extract` finds the program (the last fenced block of the
task's language, else the whole completion); :mod:`~rewardd.verifiers.code.spec` reads the reference
into test runs (stdin/stdout, function calls, assert-style test code lifted into expressions)
and expected answers; :mod:`~rewardd.verifiers.code.sandbox` runs the program (the runs only: the
expected answers never enter it; :mod:`~rewardd.verifiers.code.types` is the boundary's data);
:mod:`~rewardd.verifiers.code.compare` judges each result as plain data, outside;
:mod:`~rewardd.verifiers.code.verifier` ties them together into a reward and a per-test ``detail``.
"""

from __future__ import annotations

from rewardd.verifiers.code.verifier import CodeParams, CodeVerifier

__all__ = ["CodeParams", "CodeVerifier"]
