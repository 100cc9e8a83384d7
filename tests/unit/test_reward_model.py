"""The reward-model verifier on a real (tiny, random) Llama classifier, locally and over a real
HTTP server speaking vLLM's /classify."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

import torch
from pydantic import ValidationError

from tests.support.tiny_models import build_tiny_rm
from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import FailureKind, Sample, run_group_verifier
from rewardd.verifiers.judge.local import load_model
from rewardd.verifiers.judge.reward_model import RewardModelParams, render_ids, score_ids

SAMPLES = [
    Sample(prompt="What is 2+2?", completion="4"),
    Sample(prompt="Solve for x: 3x + 5 = 20. Show every step of the derivation, please, and "
                  "check the answer at the end. " * 6,
           completion="3x = 15, so x = 5. Check: 3*5 + 5 = 20."),
    Sample(prompt="", completion="The quick brown fox jumps over the lazy dog."),
    Sample(prompt="Capital of France?", completion="Paris is the capital of France. " * 3),
    Sample(prompt="hi", completion="1 2 3"),
]


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_rm(tmp_path_factory.mktemp("tiny_rm")))


@pytest.fixture(autouse=True)
def allowed_models(tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers load models only under REWARDD_MODEL_ROOTS and call only listed endpoints;
    these tests' models live in pytest's temporary directory, their servers on any port."""
    monkeypatch.setenv("REWARDD_MODEL_ROOTS", str(tmp_path_factory.getbasetemp()))
    monkeypatch.setenv("REWARDD_JUDGE_ALLOW_REQUEST_URLS", "1")


def test_models_outside_the_roots_and_unlisted_endpoints_are_refused(
        rm_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    verifier = REGISTRY["reward_model"]
    monkeypatch.setenv("REWARDD_MODEL_ROOTS", str(tmp_path / "models"))
    [out] = run_group_verifier(verifier, SAMPLES[:1], {}, local_params(rm_path))
    assert out.error == FailureKind.judge_unavailable
    assert "REWARDD_MODEL_ROOTS" in out.detail["message"]
    monkeypatch.delenv("REWARDD_MODEL_ROOTS")
    [out] = run_group_verifier(verifier, SAMPLES[:1], {}, local_params(rm_path))
    assert "not set" in out.detail["message"]
    monkeypatch.delenv("REWARDD_JUDGE_ALLOW_REQUEST_URLS")
    [out] = run_group_verifier(verifier, SAMPLES[:1], {},
                               {"endpoint": "http://169.254.169.254", "served_model": "x"})
    assert out.error == FailureKind.judge_unavailable
    assert "REWARDD_MODEL_ENDPOINTS" in out.detail["message"]


def local_params(rm_path: str, **extra: Any) -> dict[str, Any]:
    return {"model": rm_path, "device": "cpu", **extra}


def rewards(outcomes: list[Any]) -> list[float]:
    assert all(o.ok for o in outcomes), [o.detail for o in outcomes]
    return [o.reward for o in outcomes]


def manual_score(rm_path: str, ids: list[int]) -> float:
    """The model run the plain way, on one unpadded sequence: transformers' own pooling."""
    model = load_model(rm_path, "sequence_classification", device="cpu").model
    with torch.inference_mode():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def test_batched_scores_equal_one_at_a_time_scores_despite_padding(rm_path: str) -> None:
    verifier = REGISTRY["reward_model"]
    batched = rewards(run_group_verifier(verifier, SAMPLES, {},
                                         local_params(rm_path, batch_size=len(SAMPLES))))
    alone = [rewards(run_group_verifier(verifier, [s], {}, local_params(rm_path)))[0]
             for s in SAMPLES]
    assert batched == pytest.approx(alone, abs=1e-5)
    # the prompts differ a lot in length, so the batch really was padded ...
    tokenizer = load_model(rm_path, "sequence_classification", device="cpu").tokenizer
    params = RewardModelParams.model_validate(local_params(rm_path))
    lengths = [len(render_ids(tokenizer, s, params)) for s in SAMPLES]
    assert max(lengths) > 4 * min(lengths)
    # ... and the scores are the unpadded model's own, not artefacts of one another
    assert alone == pytest.approx([manual_score(rm_path, render_ids(tokenizer, s, params))
                                   for s in SAMPLES], abs=1e-5)
    assert len({round(r, 4) for r in batched}) == len(SAMPLES)


def test_score_is_read_at_last_real_token_even_when_text_ends_in_pad_id(rm_path: str) -> None:
    """transformers' pooling skips trailing pad ids; a real text may end in that id."""
    loaded = load_model(rm_path, "sequence_classification", device="cpu")
    pad = loaded.tokenizer.pad_token_id
    ids = loaded.tokenizer("Paris is the capital")["input_ids"] + [pad]
    model = loaded.model
    with torch.inference_mode():
        hidden = model.base_model(input_ids=torch.tensor([ids])).last_hidden_state
        expected = float(model.score(hidden[0, -1])[0])
    got = score_ids(loaded, [ids, ids[:3]], label=0)[0]
    assert got == pytest.approx(expected, abs=1e-5)
    assert got != pytest.approx(manual_score(rm_path, ids), abs=1e-3)


def test_left_truncation_keeps_the_end_and_right_truncation_the_start(rm_path: str) -> None:
    sample = Sample(prompt="Please grade the following answer. " * 4,
                    completion="The answer is correct because the derivation checks every step.")
    tokenizer = load_model(rm_path, "sequence_classification", device="cpu").tokenizer
    full = render_ids(tokenizer, sample, RewardModelParams.model_validate(local_params(rm_path)))
    max_length = 20
    assert len(full) > max_length + 5
    verifier = REGISTRY["reward_model"]
    [left] = run_group_verifier(verifier, [sample], {},
                                local_params(rm_path, max_length=max_length))
    [right] = run_group_verifier(verifier, [sample], {},
                                 local_params(rm_path, max_length=max_length,
                                              truncation_side="right"))
    bos = [tokenizer.bos_token_id]
    assert full[0] == bos[0]
    kept_end = bos + full[-(max_length - 1):]
    kept_start = full[:max_length]
    assert left.detail["truncated"] is True and left.detail["tokens"] == max_length
    assert right.detail["truncated"] is True and right.detail["tokens"] == max_length
    assert left.reward == pytest.approx(manual_score(rm_path, kept_end), abs=1e-5)
    assert right.reward == pytest.approx(manual_score(rm_path, kept_start), abs=1e-5)
    assert left.reward != pytest.approx(right.reward, abs=1e-3)
    [whole] = run_group_verifier(verifier, [sample], {}, local_params(rm_path))
    assert whole.detail == {"model": rm_path, "truncated": False, "tokens": len(full)}


def test_scale_and_shift_are_applied_to_the_raw_score(rm_path: str) -> None:
    verifier = REGISTRY["reward_model"]
    raw = rewards(run_group_verifier(verifier, SAMPLES[:2], {}, local_params(rm_path)))
    scaled = rewards(run_group_verifier(verifier, SAMPLES[:2], {},
                                        local_params(rm_path, scale=-2.0, shift=0.5)))
    assert scaled == pytest.approx([-2.0 * r + 0.5 for r in raw], abs=1e-6)


def test_verifier_returns_one_success_per_sample_with_plain_text_too(rm_path: str) -> None:
    outcomes = run_group_verifier(REGISTRY["reward_model"], SAMPLES, {},
                                  local_params(rm_path, chat_template=False, batch_size=2))
    assert len(outcomes) == len(SAMPLES)
    assert all(o.ok and o.error is None and o.detail["truncated"] is False for o in outcomes)


def test_model_that_cannot_load_fails_every_sample_as_judge_unavailable(tmp_path: Path) -> None:
    missing = run_group_verifier(REGISTRY["reward_model"], SAMPLES, {},
                                 {"model": str(tmp_path / "nope")})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    broken = run_group_verifier(REGISTRY["reward_model"], SAMPLES[:2], {},
                                {"model": str(tmp_path / "broken")})
    for outcomes, count in ((missing, len(SAMPLES)), (broken, 2)):
        assert len(outcomes) == count
        assert all(not o.ok and o.reward is None and o.error is FailureKind.judge_unavailable
                   for o in outcomes)


def test_label_beyond_the_head_is_an_error_for_every_sample(rm_path: str) -> None:
    outcomes = run_group_verifier(REGISTRY["reward_model"], SAMPLES[:2], {},
                                  local_params(rm_path, label=1))
    assert [o.error for o in outcomes] == [FailureKind.error] * 2
    assert "label 1 is out of range" in outcomes[0].detail["message"]


@pytest.mark.parametrize("params, message", [
    ({}, "exactly one of 'model'"),
    ({"model": "/m", "endpoint": "http://h:8000"}, "exactly one of 'model'"),
    ({"model": "/m", "served_model": "rm"}, "'served_model' applies to 'endpoint' only"),
    ({"endpoint": "ftp://h"}, "http:// or https://"),
    ({"endpoint": "http://h:8000", "truncation_side": "right"}, "needs 'tokenizer'"),
    ({"model": "/m", "temperature": 0}, "Extra inputs are not permitted"),
])
def test_params_are_validated(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RewardModelParams.model_validate(params)


# --------------------------------------------------------------------------- vLLM /classify


class ClassifyServer:
    """A real HTTP server answering ``POST /classify`` in vLLM's response shape, scoring each
    input text with the tiny model (raw logits, as vLLM does with use_activation=false).
    ``failures`` holds status codes to answer, one per request, before answering normally."""

    def __init__(self, rm_path: str) -> None:
        self.rm_path = rm_path
        self.requests: list[dict[str, Any]] = []
        self.failures: list[int] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    status = server.failures.pop(0) if server.failures else 200
                if self.path != "/classify":
                    status = 404
                if status != 200:
                    self._send(status, {"error": {"message": "try later"}})
                    return
                self._send(200, server.classify(body))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def classify(self, body: dict[str, Any]) -> dict[str, Any]:
        loaded = load_model(self.rm_path, "sequence_classification", device="cpu")
        data = []
        for index, text in enumerate(body["input"]):
            ids = loaded.tokenizer(text, add_special_tokens=body["add_special_tokens"])["input_ids"]
            if body.get("truncate_prompt_tokens"):
                ids = ids[-body["truncate_prompt_tokens"]:]
            logit = manual_score(self.rm_path, ids)
            data.append({"index": index, "label": "LABEL_0", "probs": [logit], "num_classes": 1})
        return {"id": "classify-1", "object": "list", "created": 0, "model": body.get("model"),
                "data": data, "usage": {"prompt_tokens": 0, "total_tokens": 0}}

    def __enter__(self) -> ClassifyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def classify_server(rm_path: str) -> Iterator[ClassifyServer]:
    with ClassifyServer(rm_path) as server:
        yield server


def endpoint_params(server: ClassifyServer, rm_path: str, **extra: Any) -> dict[str, Any]:
    return {"endpoint": server.url, "served_model": "tiny-rm", "tokenizer": rm_path,
            "retry_backoff_s": 0.01, **extra}


def test_endpoint_scores_equal_local_scores_and_ask_for_raw_logits(
        rm_path: str, classify_server: ClassifyServer) -> None:
    verifier = REGISTRY["reward_model"]
    local = rewards(run_group_verifier(verifier, SAMPLES, {}, local_params(rm_path)))
    remote = run_group_verifier(verifier, SAMPLES, {},
                                endpoint_params(classify_server, rm_path, batch_size=3))
    assert rewards(remote) == pytest.approx(local, abs=1e-5)
    assert [len(r["input"]) for r in classify_server.requests] == [3, 2]
    for request in classify_server.requests:
        assert request["activation"] is False and request["use_activation"] is False
        assert request["model"] == "tiny-rm"
        assert request["add_special_tokens"] is False  # the chat template wrote BOS
    tokenizer = load_model(rm_path, "sequence_classification", device="cpu").tokenizer
    tokens = len(render_ids(tokenizer, SAMPLES[0],
                            RewardModelParams.model_validate(local_params(rm_path))))
    assert remote[0].detail == {"model": "tiny-rm", "truncated": False, "tokens": tokens}


def test_endpoint_truncates_client_side_like_the_local_model(
        rm_path: str, classify_server: ClassifyServer) -> None:
    verifier = REGISTRY["reward_model"]
    for side in ("left", "right"):
        local = run_group_verifier(verifier, SAMPLES, {},
                                   local_params(rm_path, max_length=16, truncation_side=side))
        remote = run_group_verifier(verifier, SAMPLES, {},
                                    endpoint_params(classify_server, rm_path, max_length=16,
                                                    truncation_side=side))
        assert rewards(remote) == pytest.approx(rewards(local), abs=1e-5)
        assert ([o.detail["truncated"] for o in remote]
                == [o.detail["truncated"] for o in local])


def test_a_cut_through_a_multibyte_character_scores_the_same_tokens_on_both_paths(
        rm_path: str, classify_server: ClassifyServer) -> None:
    """Byte-level tokens split 'é' and the CJK characters: the kept ids of a plain cut may
    decode to U+FFFD, which the server would re-encode to other tokens."""
    samples = [Sample("日本語のテキスト、ありがとう。 café crème brûlée 漢字かな交じり文",
                      prompt="Say something.")]
    verifier = REGISTRY["reward_model"]
    for max_length in range(8, 24):
        for side in ("left", "right"):
            local = run_group_verifier(verifier, samples, {}, local_params(
                rm_path, max_length=max_length, truncation_side=side))
            remote = run_group_verifier(verifier, samples, {}, endpoint_params(
                classify_server, rm_path, max_length=max_length, truncation_side=side))
            assert rewards(remote) == pytest.approx(rewards(local), abs=1e-5)
            assert remote[0].detail["tokens"] == local[0].detail["tokens"] <= max_length


def test_endpoint_without_tokenizer_sends_plain_text_for_server_side_truncation(
        rm_path: str, classify_server: ClassifyServer) -> None:
    outcomes = run_group_verifier(REGISTRY["reward_model"], SAMPLES[:1], {},
                                  {"endpoint": classify_server.url, "max_length": 64})
    assert rewards(outcomes) and outcomes[0].detail["truncated"] is None
    [request] = classify_server.requests
    assert request["input"] == ["What is 2+2?\n4"]
    assert request["add_special_tokens"] is True and request["truncate_prompt_tokens"] == 64
    assert "model" not in request


def test_endpoint_503_is_retried_then_succeeds(rm_path: str,
                                               classify_server: ClassifyServer) -> None:
    classify_server.failures = [503]
    outcomes = run_group_verifier(REGISTRY["reward_model"], SAMPLES[:2], {},
                                  endpoint_params(classify_server, rm_path))
    local = rewards(run_group_verifier(REGISTRY["reward_model"], SAMPLES[:2], {},
                                       local_params(rm_path)))
    assert rewards(outcomes) == pytest.approx(local, abs=1e-5)
    assert len(classify_server.requests) == 2


def test_endpoint_persistent_500_makes_every_sample_judge_unavailable(
        rm_path: str, classify_server: ClassifyServer) -> None:
    classify_server.failures = [500] * 10
    outcomes = run_group_verifier(REGISTRY["reward_model"], SAMPLES, {},
                                  endpoint_params(classify_server, rm_path, max_retries=2))
    assert len(classify_server.requests) == 3  # first try and two retries, then it gives up
    assert len(outcomes) == len(SAMPLES)
    assert all(o.error is FailureKind.judge_unavailable for o in outcomes)
    assert "HTTP 500" in outcomes[0].detail["message"]


def test_endpoint_that_refuses_connections_is_judge_unavailable(rm_path: str) -> None:
    with ClassifyServer(rm_path) as server:
        url = server.url  # a port that was just closed
    outcomes = run_group_verifier(REGISTRY["reward_model"], SAMPLES[:2], {},
                                  {"endpoint": url, "max_retries": 1, "retry_backoff_s": 0.01})
    assert [o.error for o in outcomes] == [FailureKind.judge_unavailable] * 2
