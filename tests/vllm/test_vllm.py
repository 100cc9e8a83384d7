"""rewardd's judge clients against a real vLLM CPU server with tiny random models (no hub).

Run by ``make test-vllm`` (also in CI): vLLM lives in its own virtual environment
(``.venv-vllm``; its pins of transformers and fastapi differ from rewardd's), named by
``REWARDD_VLLM_PYTHON``. Two servers start side by side, ``python -m
vllm.entrypoints.openai.api_server``: a tiny Llama chat model and a tiny Llama
sequence-classification model, both with head dimension 64 (what vLLM's CPU attention takes),
built here and saved locally. The production client code paths are exercised unchanged:
:class:`~rewardd.verifiers.judge.openai_compat.OpenAIChatBackend` for chat and structured output, the
rubric verifier with vLLM's regex-constrained decoding, and the reward-model verifier's
``/classify`` client, whose scores must equal the local transformers path's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.support.server import free_port
from tests.support.tiny_models import build_tiny_lm, build_tiny_rm
from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import GroupContext, Sample, run_group_verifier
from rewardd.verifiers.judge.backend import ChatReply, ChatRequest
from rewardd.verifiers.judge.config import reset_backends
from rewardd.verifiers.judge.openai_compat import OpenAIChatBackend, OpenAIConfig, ReplyCache

pytestmark = pytest.mark.vllm

READY_S = 300.0
CONTEXT = 4096
"""Tokens of context: a rubric prompt is several hundred tokens with the tiny tokenizer."""


@contextlib.contextmanager
def vllm_server(model: Path, served: str) -> Iterator[tuple[str, subprocess.Popen]]:
    python = os.environ.get("REWARDD_VLLM_PYTHON")
    if not python:
        pytest.fail("REWARDD_VLLM_PYTHON is not set: run these tests with `make test-vllm`, "
                    "which builds .venv-vllm")
    python = str(Path(python).absolute())  # the server runs in the model's directory
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    log = tempfile.NamedTemporaryFile("w+", prefix="vllm-", suffix=".log")
    proc = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", served, "--dtype", "float32", "--max-model-len", str(CONTEXT),
         "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)],
        cwd=model, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def wait_ready(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vLLM exited with {proc.returncode}; see its log")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"vLLM at {url} not ready within {READY_S:g} s")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {"lm": build_tiny_lm(root / "lm", head_dim=64, context=CONTEXT),
            "rm": build_tiny_rm(root / "rm", head_dim=64, context=CONTEXT)}


@pytest.fixture(scope="module")
def servers(models: dict[str, Path]) -> Iterator[dict[str, str]]:
    """Both servers started at once (each takes tens of seconds to come up on a CPU)."""
    with vllm_server(models["lm"], "tiny") as (chat, chat_proc), \
            vllm_server(models["rm"], "tiny-rm") as (classify, classify_proc):
        wait_ready(chat, chat_proc)
        wait_ready(classify, classify_proc)
        yield {"chat": chat, "classify": classify}


@pytest.fixture
def judge_env(servers: dict[str, str], models: dict[str, Path],
              monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("REWARDD_JUDGE_BASE_URL", f"{servers['chat']}/v1")
    monkeypatch.setenv("REWARDD_JUDGE_MODEL", "tiny")
    monkeypatch.setenv("REWARDD_MODEL_ROOTS", str(models["rm"].parent))
    monkeypatch.setenv("REWARDD_MODEL_ENDPOINTS", servers["classify"])
    reset_backends()
    yield
    reset_backends()


def chat_backend(servers: dict[str, str]) -> OpenAIChatBackend:
    return OpenAIChatBackend(OpenAIConfig(name="vllm", base_url=f"{servers['chat']}/v1",
                                          model="tiny", timeout_s=60), cache=ReplyCache())


def test_chat_completions_with_usage(servers: dict[str, str]) -> None:
    requests = [ChatRequest((("user", f"hello number {i}"),), max_tokens=6) for i in range(4)]
    replies = chat_backend(servers).chat(requests)
    assert all(isinstance(r, ChatReply) for r in replies), replies
    for reply in replies:
        assert reply.prompt_tokens > 0 and 0 < reply.completion_tokens <= 6
        assert reply.finish_reason in ("length", "stop")
    again = chat_backend(servers).chat(requests[:1])  # greedy: the same text
    assert again[0].text == replies[0].text


def test_structured_output_follows_the_schema(servers: dict[str, str]) -> None:
    schema = {"type": "object", "properties": {"criteria_met": {"type": "boolean"}},
              "required": ["criteria_met"], "additionalProperties": False}
    [reply] = chat_backend(servers).chat([ChatRequest((("user", "grade"),), max_tokens=24,
                                                      json_schema=schema)])
    assert isinstance(reply, ChatReply) and reply.text.lstrip().startswith("{")
    regex = {"structured_outputs": {"regex": r'\{"criteria_met": (true|false)\}'}}
    [reply] = chat_backend(servers).chat([ChatRequest((("user", "grade"),), max_tokens=24,
                                                      extra_body=regex)])
    assert reply.text in ('{"criteria_met": true}', '{"criteria_met": false}')


def test_rubric_verdicts_from_a_random_model_under_constrained_decoding(judge_env: None) -> None:
    """A random model cannot grade, but constrained to the verdict format its answers parse:
    the rubric path yields rewards (0 or 1 for one criterion) and usage, never a default."""
    params = {"rubric": [{"criterion": "Mentions 'tides'", "points": 1}], "retries": 0,
              "max_tokens": 64, "extra_body": {"structured_outputs": {
                  "regex": r'\{"explanation": "x", "criteria_met": (true|false)\}'}}}
    out = run_group_verifier(REGISTRY["rubric"], [Sample("The moon pulls the sea.", "Tides?"),
                                                  Sample("No idea.", "Tides?")], {}, params,
                             GroupContext("r", "g"))
    assert all(o.ok and o.reward in (0.0, 1.0) for o in out), [o.detail for o in out]
    assert out[0].detail["judge"]["model"] == "tiny"
    assert out[0].detail["judge"]["prompt_tokens"] > 0


def test_classify_scores_equal_the_local_reward_model(judge_env: None, servers: dict[str, str],
                                                      models: dict[str, Path]) -> None:
    samples = [Sample("4", prompt="What is 2+2?"),
               Sample("Paris is the capital of France.", prompt="Capital of France?"),
               Sample("The quick brown fox jumps over the lazy dog.", prompt="")]
    verifier = REGISTRY["reward_model"]
    local = run_group_verifier(verifier, samples, {}, {"model": str(models["rm"]),
                                                       "device": "cpu"})
    remote = run_group_verifier(verifier, samples, {}, {
        "endpoint": servers["classify"], "served_model": "tiny-rm",
        "tokenizer": str(models["rm"])})
    assert all(o.ok for o in local + remote), [o.detail for o in local + remote]
    for a, b in zip(local, remote):
        assert b.reward == pytest.approx(a.reward, abs=1e-3)  # raw logits, not sigmoid
    assert len({round(o.reward, 3) for o in remote}) == 3
