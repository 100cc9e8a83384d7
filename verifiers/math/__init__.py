"""The ``math`` verifier: is the model's final answer mathematically equal to the reference?

Pipeline: :mod:`~rewardd.verifiers.math.extract` finds the answer in the completion (a documented
priority order, reported as ``detail.rule``); :mod:`~rewardd.verifiers.math.normalize` gives each
notation one spelling; :mod:`~rewardd.verifiers.math.answer` parses structure by hand and leaves with
the exact number reader or latex2sympy2_extended; :mod:`~rewardd.verifiers.math.guards` keeps huge
numbers away from exact arithmetic; :mod:`~rewardd.verifiers.math.compare` decides equivalence and
names the rule (``detail.decided_by``). Why not math-verify: it rounds floats to a fixed number
of decimal places (so ``2^{-99}`` equals ``2^{-98}``), its signal-based timeouts fail outside
the main thread and cannot stop big-integer arithmetic, and it reads plain-text equations
loosely; rewardd's benchmark (``tests/benchmarks/bench_math.py``) compares the two.

Extraction (``extraction``, issue 31): ``strict`` reads a box or an explicit final-answer
phrase only; ``standard`` (default) every rule of :mod:`.extract` except a last number stated
among candidates (``16 8``, ``3 or 4``) or followed by a sentence of words; ``lenient`` the
last number anywhere. ``detail.extraction`` names the reading.

Conventions (defaults: ``mode="lenient"``, ``extraction="standard"``):

* Numbers are exact: integers and fractions never get a tolerance; ``0.5 = 1/2``; thousands
  separators (``1,000``) are read, and a comma that cannot group thousands (``2,74``,
  ``1000,99``, ``0,111``) is a decimal comma against one number, a list separator against a
  list; scientific notation (``1.5\\times10^{3}``) and mixed numbers (``3\\frac12``)
  are read. A decimal with at least ``min_rounding_digits`` (4) significant digits equals a
  value it correctly rounds (``3.142 = \\pi``, but ``3.14 != \\pi``); decimals among
  themselves agree within ``rel_tol`` (1e-9, relative, never absolute).
* ``p\\%`` equals p or p/100 (``percent``); ``30^\\circ`` equals 30, and ``\\pi/6`` in lenient
  mode; units (``\\text{ cm}``) are ignored unless both sides name different units.
* Expressions are equal when their variables are the same and they agree at fixed sample
  points, and closed forms without variables when they agree, to a precision that scales with
  what was written (10^-(25 + spread) at 40 + spread digits, :mod:`.precision`): a difference
  written in an answer is never rounded away; ``e`` is Euler's number and ``i`` the
  imaginary unit.
* Equations are equal when one side-difference is a nonzero multiple of the other
  (``y = 2x+1`` is ``2x - y + 1 = 0``); inequalities likewise with a positive multiple and
  either direction written (``x > 3`` is ``3 < x``). Lenient: ``x = 5`` equals ``5`` and
  ``x > 3`` equals ``(3, \\infty)``. A chain answers with its last exact side (an
  ``\\approx`` tail is dropped); a closed form equals its value (``2^{10} = 1024``), but an
  equation is never its right side when that side has variables (``7 = 11a+c`` is not
  ``11a+c``).
* A multi-answer reference needs all its parts, in any order, however joined (``19, 46,
  and 82``; ``$21,16$ or $11$``; ``p=5,q=2;p=7,q=2``; ``p = -1 \\text{ and } p = 15/8``,
  one unknown given two values).
* Sets and bare lists (``1, 2``) are unordered; tuples ordered; ``(1, 2)`` is both a point and
  an open interval; intervals compare endpoints and closedness; matrices entry by entry.
* Words (``\\text{Yes}``) compare case-insensitively, and words in a math span (``$odd$``)
  answer a text reference (never a number); a letter reference (``(C)``) makes the
  question multiple choice and the chosen letter is compared.
* Strict mode turns off rounding, assignment, set/list, interval/inequality, degree/radian
  and singleton leniencies, and reads ``p\\%`` as p/100.
"""

from __future__ import annotations

from rewardd.verifiers.math.verifier import MathParams, MathVerifier, clear_caches

__all__ = ["MathParams", "MathVerifier", "clear_caches"]
