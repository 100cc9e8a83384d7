"""The local generative judge backend on a real (tiny, random) Llama causal LM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.tiny_models import build_tiny_lm
from rewardd.verifiers.judge.backend import ChatReply, ChatRequest, JudgeUnavailable
from rewardd.verifiers.judge.local import TransformersChatBackend, cached_models, load_model

REPO_ROOT = Path(__file__).resolve().parents[2]

REQUESTS = [
    ChatRequest(messages=(("user", "What is 2+2?"),), max_tokens=12),
    ChatRequest(messages=(("system", "You are a careful judge of mathematical reasoning."),
                          ("user", "Please grade the following answer. The answer is correct "
                                   "because the derivation checks every step. " * 3)),
                max_tokens=12),
    ChatRequest(messages=(("user", "hi"),), max_tokens=12),
    ChatRequest(messages=(("user", "Capital of France?"),), max_tokens=12),
]


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_lm(tmp_path_factory.mktemp("tiny_lm")))


def backend(path: str, **kwargs: object) -> TransformersChatBackend:
    return TransformersChatBackend(path, device="cpu", **kwargs)


def replies(results: list[object]) -> list[ChatReply]:
    assert all(isinstance(r, ChatReply) for r in results), results
    return results  # type: ignore[return-value]


def prompt_ids(path: str, request: ChatRequest) -> list[int]:
    """The rendered prompt, tokenized the way transformers itself does it."""
    tokenizer = load_model(path, "causal_lm", device="cpu").tokenizer
    return list(tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in request.messages], add_generation_prompt=True,
        tokenize=True, return_dict=True)["input_ids"])


def greedy_tokens(path: str, request: ChatRequest) -> list[int]:
    """New tokens of plain unbatched greedy ``generate`` with no end-of-sequence token."""
    model = load_model(path, "causal_lm", device="cpu").model
    ids = torch.tensor([prompt_ids(path, request)])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=request.max_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def test_batched_greedy_replies_equal_one_at_a_time_replies(lm_path: str) -> None:
    judge = backend(lm_path, batch_size=len(REQUESTS))
    batched = replies(judge.chat(REQUESTS))
    alone = [replies(judge.chat([request]))[0] for request in REQUESTS]
    assert [r.text for r in batched] == [r.text for r in alone]
    assert batched == alone
    lengths = [len(prompt_ids(lm_path, r)) for r in REQUESTS]
    assert max(lengths) > 4 * min(lengths)  # the batch was left-padded a lot
    # and the texts are what the model generates unbatched, decoded
    tokenizer = load_model(lm_path, "causal_lm", device="cpu").tokenizer
    for request, reply in zip(REQUESTS, batched):
        assert reply.text == tokenizer.decode(greedy_tokens(lm_path, request),
                                              skip_special_tokens=True)


def test_token_counts_are_the_unpadded_prompt_and_the_generated_tokens(lm_path: str) -> None:
    results = replies(backend(lm_path, batch_size=2).chat(REQUESTS))
    for request, reply in zip(REQUESTS, results):
        assert reply.prompt_tokens == len(prompt_ids(lm_path, request))
        assert reply.completion_tokens == request.max_tokens
        assert reply.finish_reason == "length"


def test_max_tokens_bounds_the_completion_with_finish_reason_length(lm_path: str) -> None:
    short = [ChatRequest(messages=r.messages, max_tokens=n)
             for r, n in zip(REQUESTS, (1, 3, 5, 12))]
    results = replies(backend(lm_path).chat(short))
    assert [r.completion_tokens for r in results] == [1, 3, 5, 12]
    assert [r.finish_reason for r in results] == ["length"] * 4
    tokenizer = load_model(lm_path, "causal_lm", device="cpu").tokenizer
    for request, reply in zip(short, results):
        assert reply.text == tokenizer.decode(greedy_tokens(lm_path, request),
                                              skip_special_tokens=True)


def test_end_of_sequence_token_stops_with_finish_reason_stop(lm_path: str,
                                                             tmp_path: Path) -> None:
    """A copy of the model whose generation config lists a second end-of-sequence token,
    one the model emits greedily, must stop there (and count it)."""
    request = REQUESTS[0]
    tokens = greedy_tokens(lm_path, request)
    stop_token = tokens[4]
    first = tokens.index(stop_token)
    stopping = tmp_path / "lm_stop"
    shutil.copytree(lm_path, stopping)
    config_file = stopping / "generation_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token_id"] = [config["eos_token_id"], stop_token]
    config_file.write_text(json.dumps(config))
    long = ChatRequest(messages=request.messages, max_tokens=20)
    results = replies(backend(str(stopping), batch_size=4).chat([long, REQUESTS[1], long]))
    tokenizer = load_model(lm_path, "causal_lm", device="cpu").tokenizer
    for reply in (results[0], results[2]):
        assert reply.finish_reason == "stop"
        assert reply.completion_tokens == first + 1
        assert reply.text == tokenizer.decode(tokens[:first], skip_special_tokens=True)


def test_sampling_is_reproducible_per_seed_and_independent_of_the_batch(lm_path: str) -> None:
    def sampled(seed: int) -> ChatRequest:
        return ChatRequest(messages=(("user", "hi"),), max_tokens=12, temperature=1.0,
                           top_p=0.95, seed=seed)

    judge = backend(lm_path, batch_size=8)
    mixed = replies(judge.chat([sampled(1), REQUESTS[1], sampled(2), sampled(1)]))
    alone = [replies(judge.chat([sampled(seed)]))[0] for seed in (1, 2)]
    assert mixed[0] == mixed[3] == alone[0]
    assert mixed[2] == alone[1]
    assert mixed[0].text != mixed[2].text
    assert mixed[1] == replies(judge.chat([REQUESTS[1]]))[0]  # greedy rows untouched


def test_model_is_loaded_once_per_process_and_shared_by_backends(lm_path: str) -> None:
    first, second = backend(lm_path), backend(lm_path, batch_size=1)
    replies(first.chat(REQUESTS[:1]))
    replies(second.chat(REQUESTS[:1]))
    assert first.load() is second.load()
    assert first.load().model is second.load().model
    keys = [key for key in cached_models()
            if key[0] == "causal_lm" and key[1] == os.path.realpath(lm_path)]
    assert keys == [("causal_lm", os.path.realpath(lm_path), "cpu", "float32")]


def test_bad_model_path_gives_judge_unavailable_for_every_request(tmp_path: Path) -> None:
    results = backend(str(tmp_path / "missing")).chat(REQUESTS[:3])
    assert len(results) == 3
    assert all(isinstance(r, JudgeUnavailable) and "missing" in r.message for r in results)
    (tmp_path / "empty").mkdir()
    results = backend(str(tmp_path / "empty")).chat(REQUESTS[:2])
    assert all(isinstance(r, JudgeUnavailable) for r in results)
    assert backend(str(tmp_path / "missing")).chat([]) == []


def test_prompt_beyond_the_model_positions_fails_only_its_own_request(lm_path: str) -> None:
    too_long = ChatRequest(messages=(("user", "one two three " * 200),), max_tokens=12)
    results = backend(lm_path).chat([REQUESTS[0], too_long])
    assert isinstance(results[0], ChatReply)
    assert isinstance(results[1], JudgeUnavailable) and "positions" in results[1].message


VERDICT_SCHEMA = {"type": "object", "additionalProperties": False,
                  "required": ["explanation", "met"],
                  "properties": {"explanation": {"type": "string", "maxLength": 6},
                                 "met": {"type": "boolean"}}}


def test_json_schema_is_enforced_by_constrained_decoding(lm_path: str) -> None:
    structured = [ChatRequest(messages=(("user", f"grade answer {i}"),), max_tokens=60,
                              json_schema=VERDICT_SCHEMA, temperature=t, seed=i)
                  for i in range(3) for t in (0.0, 1.0)]
    free = REQUESTS[0]
    mixed = replies(backend(lm_path).chat([*structured, free]))
    for reply in mixed[:-1]:  # a random model, yet every answer is the schema's JSON
        assert reply.finish_reason == "stop"
        answer = json.loads(reply.text, strict=False)  # xgrammar lets control characters in
        assert list(answer) == ["explanation", "met"]  # in the schema's order
        assert isinstance(answer["met"], bool) and len(answer["explanation"]) <= 6
    # the unconstrained request in the same batch decodes as it does alone
    assert mixed[-1].text == replies(backend(lm_path).chat([free]))[0].text


def test_a_schema_that_cannot_be_compiled_fails_only_its_own_request(lm_path: str) -> None:
    bad = ChatRequest(messages=(("user", "x"),), max_tokens=8, json_schema={"type": "nonsense"})
    failed, fine = backend(lm_path).chat([bad, REQUESTS[2]])
    assert isinstance(failed, JudgeUnavailable)
    assert "json_schema cannot be compiled" in failed.message
    assert isinstance(fine, ChatReply)


def test_modules_import_without_torch() -> None:
    """CPU-only workers import the registry; it must not pull in torch or transformers."""
    code = ("import sys, rewardd.verifiers, rewardd.verifiers.judge.local, rewardd.verifiers.judge.reward_model; "
            "print(sorted({'torch', 'transformers', 'httpx'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True)
    assert "torch" not in out.stdout and "transformers" not in out.stdout, out.stdout
