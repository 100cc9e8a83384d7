"""Canary probes: from a group's own reference, completions a correct verifier must accept
and completions it must reject.

A verifier that silently breaks (the reference under another key, a chat template hiding the
answer, a sandbox without its runtime, a judge whose replies stop parsing) turns every reward
into 0, and the reward curve looks like a hard task. A probe built from the batch's own
reference tells the two apart in the first batch: the reference written the way a model
writes it must get the full reward, a perturbed answer must not. The service runs the probes
beside the batch (:mod:`rewardd.service.canaries`); this module only writes them, so it is a
pure function of (reference, params, the group's shape) and sits in the verifier layer where
a plugin can register its own maker.

A maker is found by the verifier's class, walking its bases: a plugin that subclasses
:class:`~rewardd.verifiers.math.MathVerifier` is canaried like math. A verifier without a
maker is not canaried (``regex`` and ``length`` have no reference to write a probe from;
``arena`` compares rollouts with each other). Makers stay cheap: a probe is one more check,
and the probes of a batch must cost a small share of it (README, "Canaries").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

from rewardd.verifiers.base import Verifier
from rewardd.verifiers.code.verifier import CodeVerifier
from rewardd.verifiers.judge.rubric import RubricVerifier
from rewardd.verifiers.math.extract import reference_answer
from rewardd.verifiers.math.verifier import MathVerifier
from rewardd.verifiers.text import ExactMatchVerifier

Kind = Literal["accept", "reject"]
Expect = Literal["full", "below_full", "verdict"]
"""What passes: ``full`` the full reward (1.0), ``below_full`` anything less, ``verdict``
any reward at all (a judge that answered with a verdict it could read)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One canary completion and what a correct verifier must make of it."""

    kind: Kind
    text: str
    label: str
    """What the probe is, in words, for the problem messages ("the reference as
    ``\\boxed{...}``", "an empty program")."""
    expect: Expect
    shaped: bool = False
    """Written in the shape of the group's completions (inside ``<think>`` only)."""


@dataclass(frozen=True, slots=True)
class Shape:
    """How a group's completions are written, where a probe should be written the same way."""

    think_only: bool = False
    """Most completions have their text inside ``<think>`` and nothing after it (a chat
    template or a length cut ended them there)."""


ProbeMaker = Callable[[Mapping[str, Any], Mapping[str, Any], Shape], list[Probe]]
"""(the group's reference, the component's params, the group's shape) -> probes."""

MAKERS: dict[type, ProbeMaker] = {}

_THINK_OPEN = re.compile(r"^\s*<(think|thinking|reasoning)>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(?:think|thinking|reasoning)>\s*$", re.IGNORECASE)
_INTEGER = re.compile(r"^-?\d+$")
_CHOICE = re.compile(r"^\(?([A-E])\)?$")


def register_probes(verifier_class: type, maker: ProbeMaker) -> None:
    """Canary ``verifier_class`` (and its subclasses) with ``maker`` (plugins may call it)."""
    MAKERS[verifier_class] = maker


def maker_for(verifier: Verifier) -> ProbeMaker | None:
    """The probe maker of ``verifier``'s class or its nearest base that has one."""
    for cls in type(verifier).__mro__:
        maker = MAKERS.get(cls)
        if maker is not None:
            return maker
    return None


def shape_of(completions: list[str]) -> Shape:
    """The group's shape: ``think_only`` when more than half of its completions open a
    ``<think>`` block and hold nothing after its end (or never close it)."""
    if not completions:
        return Shape()
    inside = sum(1 for text in completions if _think_only(text))
    return Shape(think_only=2 * inside > len(completions))


def _think_only(text: str) -> bool:
    match = _THINK_OPEN.match(text)
    if match is None:
        return False
    closes = list(re.finditer(rf"</{match.group(1)}>", text, re.IGNORECASE))
    return not closes or not text[closes[-1].end():].strip()


def in_think(text: str) -> str:
    """``text`` the way a think-only completion holds it."""
    return f"<think>\n{text}\n</think>"


def accepted(text: str, label: str, shape: Shape, expect: Expect = "full") -> list[Probe]:
    """The accept probe ``text``, and where the group is think-only, the same inside
    ``<think>`` (the probe that finds a verifier blind to answers there)."""
    probes = [Probe("accept", text, label, expect)]
    if shape.think_only:
        probes.append(Probe("accept", in_think(text), f"{label} inside <think> only", expect,
                            shaped=True))
    return probes


def perturbed(answer: str) -> str:
    """A different answer of the same kind: an integer plus one, another choice letter,
    else the answer plus one (never equal to it)."""
    answer = answer.strip()
    if _INTEGER.match(answer):
        return str(int(answer) + 1)
    choice = _CHOICE.match(answer)
    if choice is not None:
        return "B" if choice.group(1) == "A" else "A"
    return f"({answer})+1"


def _math(reference: Mapping[str, Any], params: Mapping[str, Any], shape: Shape) -> list[Probe]:
    raw = reference.get("answer")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raw = str(raw)
    answer = (reference_answer(raw) if isinstance(raw, str) else None) or ""
    if params.get("extract") == "none":  # the whole completion is the answer
        return [*accepted(answer, "the reference answer alone", shape),
                Probe("reject", perturbed(answer), "a perturbed answer", "below_full")]
    return [*accepted(f"The answer is \\boxed{{{answer}}}.",
                      "the reference written as 'The answer is \\boxed{...}'", shape),
            Probe("reject", f"The answer is \\boxed{{{perturbed(answer)}}}.",
                  "a perturbed answer in \\boxed{}", "below_full")]


def _exact(reference: Mapping[str, Any], params: Mapping[str, Any], shape: Shape) -> list[Probe]:
    answer = reference.get("answer")
    if not isinstance(answer, str):
        many = reference.get("answers")
        answer = many[0] if isinstance(many, list) and many and isinstance(many[0], str) else ""
    written = {"boxed": f"\\boxed{{{answer}}}", "last_line": f"So:\n{answer}"}.get(
        str(params.get("extract")), answer)
    return [*accepted(written, "the reference answer, exactly", shape),
            Probe("reject", f"{answer} (not)" if answer else "x", "a perturbed answer",
                  "below_full")]


def _code(reference: Mapping[str, Any], params: Mapping[str, Any], shape: Shape) -> list[Probe]:
    probes = []
    solution = reference.get("solution")
    if isinstance(solution, str) and solution.strip():
        language = str(reference.get("language") or params.get("language") or "python")
        probes.append(Probe("accept", f"```{language}\n{solution}\n```",
                            "the reference's own solution", "full"))
    probes.append(Probe("reject", "```python\npass\n```", "an empty program", "below_full"))
    return probes


def _judge(reference: Mapping[str, Any], params: Mapping[str, Any], shape: Shape) -> list[Probe]:
    answer = reference.get("answer")
    text = f"The answer is {answer}." if isinstance(answer, (str, int, float)) else "I do not know."
    return [Probe("accept", text, "a plain answer the judge must grade", "verdict")]


register_probes(MathVerifier, _math)
register_probes(ExactMatchVerifier, _exact)
register_probes(CodeVerifier, _code)
register_probes(RubricVerifier, _judge)

__all__ = ["MAKERS", "Probe", "ProbeMaker", "Shape", "maker_for", "perturbed", "register_probes",
           "shape_of"]
