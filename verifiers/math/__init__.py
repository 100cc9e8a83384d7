"""The ``math`` verifier: is the model's final answer mathematically equal to the reference?

Parsing and equivalence are math-verify's and latex2sympy2_extended's; this package adds a
documented answer-extraction order (:mod:`verifiers.math.extract`) and runs math-verify with
its signal-based timeouts disabled (:mod:`verifiers.math.equivalence`), since the executor
enforces wall-clock limits by killing worker processes.
"""

from __future__ import annotations

from verifiers.math.verifier import MathParams, MathVerifier

__all__ = ["MathParams", "MathVerifier"]
