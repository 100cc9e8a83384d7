"""Answers in several boxes, and the decimal-comma reading: what the verifier does to the
extracted text before parsing.

Models answer a question with several parts in several boxes: ``\\boxed{2}`` and
``\\boxed{3}`` for the solutions ``2, 3``; ``\\boxed{(1,2)}, \\boxed{(2,1)}`` for a set of
pairs; ``\\boxed{k=45}`` and ``\\boxed{n=2}``. The last box alone is then a wrong answer. When
the reference has several parts and the last box has one, the boxes of the completion's answer
part are read together, as an answer of the reference's kind: a set (``\\{2, 3\\}``) or a bare
list for an unordered reference, a tuple (``(3, 2)``) for an ordered one. A single-part
reference still uses the last box, so an abandoned first guess in a box is never counted.
"""

from __future__ import annotations

import re
from typing import Callable

import sympy

from rewardd.verifiers.math.answer import Collection, ExprLeaf, Node
from rewardd.verifiers.math.completion import split_completion
from rewardd.verifiers.math.extract import clean_answer, find_all_boxed
from rewardd.verifiers.math.labels import Labelled

_JOIN = {"set": ("\\{", "\\}"), "tuple": ("(", ")"), "pair_or_interval": ("(", ")"),
         "list": ("", "")}
_DECIMAL_COMMA = re.compile(r"^\s*([+-]?\d+)\s*(?:,|\{,\})\s*(\d+)\s*$")


def parts(node: Node) -> Collection | None:
    """The collection a multi-part answer is made of, through a label (``(p,q)=(3,2)``);
    None for a single-part answer."""
    if isinstance(node, Labelled):
        node = node.value
    if isinstance(node, ExprLeaf) and isinstance(node.expr, sympy.FiniteSet):  # 1 \pm \sqrt2
        node = Collection("set", tuple(ExprLeaf(e) for e in node.expr.args))
    return node if isinstance(node, Collection) and len(node.items) > 1 else None


def boxes(completion: str) -> list[str]:
    """The non-empty boxes of the answer part (after ``</think>``, before template debris),
    or of the reasoning when the answer part has none."""
    split = split_completion(completion)
    for segment in (split.answer, split.reasoning):
        found = [b for b in (clean_answer(b) for b in find_all_boxed(segment)) if b]
        if found:
            return found
    return []


def boxes_together(completion: str, reference: Node,
                   parse: Callable[[str], Node | str]) -> str | None:
    """Every box as one answer of the reference's kind, when the reference has several parts,
    the completion several boxes and its last box one part; else None (the last box answers
    alone). ``parse`` gives a node, or a string saying why the text does not parse."""
    collection = parts(reference)
    if collection is None:
        return None
    found = boxes(completion)
    if len(found) < 2:
        return None
    last = parse(found[-1])
    if not isinstance(last, str) and (whole := parts(last)) is not None \
            and _nested(whole) == _nested(collection):
        return None  # the last box is a whole answer of the reference's shape
    left, right = _JOIN[collection.kind]
    return left + ", ".join(found) + right


def _nested(collection: Collection) -> bool:
    """A collection of collections (``\\{(1,2),(2,1)\\}``): one pair is then one part."""
    return all(isinstance(parts(i) or i, Collection) for i in collection.items)


def decimal_comma(answer: str) -> str:
    """``2,74`` -> ``2.74`` (the ``decimal_comma`` parameter): only an answer that is one
    number with one comma between digits; anything else comes back unchanged."""
    m = _DECIMAL_COMMA.match(answer)
    return f"{m.group(1)}.{m.group(2)}" if m else answer


__all__ = ["boxes", "boxes_together", "decimal_comma", "parts"]
