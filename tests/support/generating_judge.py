"""The rule judge server (:mod:`tests.support.judge_server`) taught two more tasks, over the
same real HTTP: classifying refusals, and continuing a reasoning prefix.

* Refusal classification (the ``refusal_judge`` system message): ``refusal: true`` when the
  RESPONSE block contains ``DEFLECT``, else false (``REFUSE-ME`` and ``GARBAGE-ME`` keep their
  meaning: the judge refuses, or answers without a verdict).
* Continuation (any other request without fenced blocks): the text of every message is read
  as the prefix so far. ``so far: N`` makes the continuation end with ``\\boxed{N}``;
  ``SHAKY`` makes it ``\\boxed{N + 1}`` for odd seeds (so k samples succeed at a rate a test
  can compute); ``NO-ANSWER`` ends without an answer; ``FAIL-503`` answers 503 (a backend
  failing for good, after the client's retries).
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest

from tests.support.judge_server import (NONCE, JudgeServer, completion, fenced_blocks,
                                        judge_client_env)

REFUSAL_SYSTEM = "classify whether an AI assistant's response refuses"


class GeneratingJudgeServer(JudgeServer):
    def answer(self, handler: Any, body: dict[str, Any], fault: tuple[Any, ...] | None) -> None:
        text = " ".join(m.get("content", "") for m in body.get("messages") or [])
        if fault is None and "FAIL-503" in text and REFUSAL_SYSTEM not in text:
            handler._send(503, {"error": {"message": "injected 503"}})
            return
        if fault is None and REFUSAL_SYSTEM not in text and not NONCE.search(text):
            handler._send(200, completion(body, continue_text(text, body.get("seed") or 0)))
            return
        super().answer(handler, body, fault)

    def reply_text(self, body: dict[str, Any]) -> str:
        messages = body.get("messages") or []
        system = " ".join(m["content"] for m in messages if m.get("role") == "system")
        if REFUSAL_SYSTEM not in system:
            return super().reply_text(body)
        found = NONCE.search(system)
        response = fenced_blocks(messages[-1]["content"], found.group(1)).get("RESPONSE", "")
        if "REFUSE-ME" in response or "GARBAGE-ME" in response:
            return super().reply_text(body)
        refused = "DEFLECT" in response
        return ('{"explanation": "rule: DEFLECT marks a refusal", "refusal": %s}'
                % ("true" if refused else "false"))


def continue_text(prefix: str, seed: int) -> str:
    if "NO-ANSWER" in prefix:
        return " and then I am not sure how to finish."
    found = re.findall(r"so far: (-?\d+)", prefix)
    value = int(found[-1]) if found else 0
    if "SHAKY" in prefix and seed % 2 == 1:
        value += 1
    return f" Continuing from there, the result is {value}. Final answer: \\boxed{{{value}}}"


@pytest.fixture(scope="module")
def generating() -> Iterator[GeneratingJudgeServer]:
    """One server per test module (import this fixture and :func:`judge` into the module)."""
    server = GeneratingJudgeServer().start()
    yield server
    server.stop()


@pytest.fixture
def judge(generating: GeneratingJudgeServer,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[GeneratingJudgeServer]:
    """The module's server, reset, with REWARDD_JUDGE_* pointing at it."""
    with judge_client_env(generating, monkeypatch):
        yield generating
