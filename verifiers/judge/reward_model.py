"""Reward-model verifier: a sequence-classification model scores (prompt, completion).

Two ways to reach the model, the same scores from both:

* ``model``: a local Hugging Face directory, loaded once per worker process through the cache
  of :mod:`rewardd.verifiers.judge.local` and run in padded batches (a ``gpu`` worker's job);
* ``endpoint``: a vLLM server's ``/classify`` API (any worker; texts are rendered here).

How the score is read. A decoder reward model (Llama, Qwen, Mistral, Gemma, GPT-2 ...
``ForSequenceClassification``) has a linear head ``score`` on every position and reports the
head's value at the last token. transformers finds that token by looking for ``pad_token_id``
in the input ids, which goes wrong when the pad token also occurs in the text (often pad ==
eos, and a chat-rendered conversation ends with eos). So for such models this module runs the
base model, applies ``score`` to every position, and gathers each row at its last *real*
token: the highest index where the attention mask is 1. That works for either padding side.
Batches are right-padded: a causal model's real positions never attend to the padding and
keep their natural position ids, so a batched score equals the one-at-a-time score up to float
rounding. Models without a ``score`` head (encoders such as DeBERTa, which pool their first
token) are run whole and their own pooled ``logits`` used.

Truncation: a text longer than ``max_length`` tokens keeps its *end* by default
(``truncation_side="left"``): the end of the completion (the final answer) is what a reward
model must see, and the prompt's start is what can best be lost. A leading BOS token is kept
either way. ``truncated`` and ``tokens`` (the number scored) are in every outcome's detail.

torch, transformers and httpx are imported inside functions: CPU-only workers import the
verifier registry and must not pay for them there.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal, Mapping, Sequence

from pydantic import Field, model_validator

from rewardd.verifiers.base import (REWARD_BOUND, FailureKind, GroupContext, Outcome, RewardValue,
                            Sample, GroupVerifier, VerifierParams)
from rewardd.verifiers.judge.config import JudgeConfigError, check_endpoint, check_model_path
from rewardd.verifiers.judge.local import Dtype, LoadedModel, ModelLoadError, load_model


class RewardModelParams(VerifierParams):
    model: str | None = None
    """Local directory of a Hugging Face sequence-classification model (safetensors weights,
    tokenizer included). Give either ``model`` or ``endpoint``."""
    endpoint: str | None = None
    """Base URL of a vLLM server serving the reward model (``http://host:8000``); scores come
    from its ``POST /classify``. Give either ``model`` or ``endpoint``."""
    served_model: str | None = None
    """With ``endpoint``: the name the server serves the model under (the request's
    ``model``); None lets the server use its only model."""
    tokenizer: str | None = None
    """With ``endpoint``: local directory of the model's tokenizer, used to apply the chat
    template and to truncate to ``max_length`` here. Without it the text sent is
    ``prompt + "\\n" + completion`` and the server truncates (left only)."""
    max_length: int = Field(default=4096, gt=1)
    """Most tokens scored per sample; longer texts are truncated (see ``truncation_side``)."""
    truncation_side: Literal["left", "right"] = "left"
    """Which end loses tokens beyond ``max_length``: "left" drops the start and keeps the end
    of the completion (its final answer); "right" drops the end. A leading BOS is kept."""
    batch_size: int = Field(default=8, ge=1, le=1024)
    """Samples per forward pass (local) or per ``/classify`` request (endpoint)."""
    chat_template: bool = True
    """Render [user: prompt, assistant: completion] with the tokenizer's chat template, as
    reward models are trained; false: score the plain ``prompt + "\\n" + completion``."""
    label: int = Field(default=0, ge=0)
    """Which output of the head is the reward (for heads with several labels)."""
    scale: RewardValue = 1.0
    """Reward = ``scale * score + shift``: puts the model's logit on the scale of the
    other rewards it is combined with."""
    shift: RewardValue = 0.0
    """See ``scale``."""
    device: str | None = None
    """Local model only: torch device ("cuda", "cuda:1", "cpu"); None: cuda when available."""
    dtype: Dtype = "auto"
    """Local model only: weight precision; "auto" is bfloat16 on a GPU, float32 on a CPU."""
    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """Endpoint only: timeout of one HTTP request, in seconds."""
    max_retries: int = Field(default=3, ge=0, le=10)
    """Endpoint only: retries of a request answered 429 or 5xx, or that could not connect or
    timed out, with exponential backoff; after them every sample is ``judge_unavailable``."""
    retry_backoff_s: float = Field(default=0.5, ge=0, le=60)
    """Endpoint only: wait before the first retry; doubled for each next one (a Retry-After
    header, when longer and at most 60 s, wins)."""

    @model_validator(mode="after")
    def _one_source(self) -> RewardModelParams:
        if (self.model is None) == (self.endpoint is None):
            raise ValueError("reward_model needs exactly one of 'model' (a local directory) "
                             "or 'endpoint' (a vLLM server URL)")
        if self.model is not None:
            for name in ("served_model", "tokenizer"):
                if getattr(self, name) is not None:
                    raise ValueError(f"'{name}' applies to 'endpoint' only; a local 'model' "
                                     "brings its own tokenizer")
        else:
            if not self.endpoint.startswith(("http://", "https://")):
                raise ValueError("'endpoint' must be an http:// or https:// URL")
            if self.tokenizer is None and self.truncation_side == "right":
                raise ValueError("truncation_side='right' with an endpoint needs 'tokenizer' "
                                 "(vLLM itself only truncates on the left)")
        return self


class RewardModelVerifier(GroupVerifier):
    """Score each rollout with a reward model (local or on a vLLM server), a group per batch."""

    name = "reward_model"
    description = ("scale * score + shift, where score is a sequence-classification reward "
                   "model's output for (prompt, completion): a local model on a gpu worker or "
                   "a vLLM /classify endpoint. No reference needed.")
    reference_fields: dict[str, str] = {}
    Params = RewardModelParams

    def verify_group(self, samples: Sequence[Sample], reference: Mapping[str, Any],
                     params: RewardModelParams,
                     context: GroupContext | None = None) -> list[Outcome]:
        """Scores do not depend on ``context``: a reward model sees each rollout alone (it is
        group-level only to batch the group)."""
        if not samples:
            return []
        source = params.model if params.model is not None else (params.served_model
                                                                 or params.endpoint)
        try:
            if params.endpoint is not None:
                check_endpoint(params.endpoint)
            params = confine_paths(params)
        except JudgeConfigError as exc:
            return [Outcome.failure(FailureKind.judge_unavailable, str(exc)) for _ in samples]
        if params.model is not None:
            scored = _score_local(samples, params)
        else:
            scored = _score_endpoint(samples, params)
        if isinstance(scored, str):
            return [Outcome.failure(FailureKind.judge_unavailable, scored, model=source)
                    for _ in samples]
        outcomes = []
        for raw, truncated, tokens in scored:
            reward = params.scale * raw + params.shift
            if not math.isfinite(reward) or abs(reward) > REWARD_BOUND:
                outcomes.append(Outcome.failure(
                    FailureKind.error, f"reward model gave a non-finite or out-of-range "
                    f"score {raw!r}", model=source))
            else:
                outcomes.append(Outcome.success(reward, model=source, truncated=truncated,
                                                tokens=tokens))
        return outcomes


PATH_FIELDS = ("model", "tokenizer")
"""Every field of :class:`RewardModelParams` that names a local path to load."""


def confine_paths(params: RewardModelParams) -> RewardModelParams:
    """``params`` with every local path (:data:`PATH_FIELDS`) replaced by its real path under
    ``REWARDD_MODEL_ROOTS``; :class:`JudgeConfigError` for one outside (see
    :func:`~rewardd.verifiers.judge.config.check_model_path`). The loaders get the checked
    real paths, never the request's strings."""
    return params.model_copy(update={
        field: check_model_path(getattr(params, field), field=field)
        for field in PATH_FIELDS if getattr(params, field) is not None})


Scored = list[tuple[float, bool | None, int | None]]
"""(raw score, truncated, tokens scored) per sample; truncated and tokens are None when the
server truncated and did not say."""


# --------------------------------------------------------------------------- rendering


def plain_text(sample: Sample) -> str:
    """Text scored without a chat template: the newline keeps the prompt's last word and the
    completion's first from fusing into one token."""
    return f"{sample.prompt}\n{sample.completion}" if sample.prompt else sample.completion


def render_text(tokenizer: Any, sample: Sample, params: RewardModelParams) -> tuple[str, bool]:
    """The text the reward model reads, and whether tokenizing it must add special tokens
    (false for a chat-rendered text: the template writes BOS itself)."""
    if not params.chat_template:
        return plain_text(sample), True
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat_template=true but the tokenizer has no chat template; "
                         "set chat_template=false to score plain text")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": sample.prompt},
         {"role": "assistant", "content": sample.completion}], tokenize=False)
    return text, False


def render_ids(tokenizer: Any, sample: Sample, params: RewardModelParams) -> list[int]:
    """Token ids of the sample as the reward model reads it, before truncation."""
    text, add_special = render_text(tokenizer, sample, params)
    return list(tokenizer(text, add_special_tokens=add_special)["input_ids"])


def truncate_ids(ids: list[int], max_length: int, side: str,
                 bos_id: int | None) -> tuple[list[int], bool]:
    """At most ``max_length`` ids, dropping from ``side``; a leading BOS is always kept."""
    if len(ids) <= max_length:
        return ids, False
    head = ids[:1] if bos_id is not None and ids and ids[0] == bos_id else []
    body = ids[len(head):]
    keep = max(max_length - len(head), 0)
    return head + (body[len(body) - keep:] if side == "left" else body[:keep]), True


TEXT_SAFE_TRIES = 8
"""How many more tokens a cut may drop to land between characters (a multi-byte character
spans at most 4 byte-level tokens; the margin covers merges around it)."""


def truncate_text_safe(tokenizer: Any, ids: list[int], max_length: int,
                       side: str) -> tuple[list[int], bool]:
    """:func:`truncate_ids`, with the cut moved (one token further at a time) until the kept
    ids decode to a text that encodes back to the same ids. A cut through a multi-byte
    character would decode to U+FFFD and re-encode to other tokens: an endpoint, which gets
    text, would then score something else than the local model. Both paths cut here, so
    they score the same tokens; when no cut within :data:`TEXT_SAFE_TRIES` round-trips, the
    plain cut is kept."""
    kept, truncated = truncate_ids(ids, max_length, side, tokenizer.bos_token_id)
    if not truncated:
        return kept, False
    for fewer in range(TEXT_SAFE_TRIES + 1):
        candidate, _ = truncate_ids(ids, max_length - fewer, side, tokenizer.bos_token_id)
        text = tokenizer.decode(candidate)
        if list(tokenizer(text, add_special_tokens=False)["input_ids"]) == candidate:
            return candidate, True
    return kept, True


# --------------------------------------------------------------------------- local model


def _score_local(samples: Sequence[Sample], params: RewardModelParams) -> Scored | str:
    """Scores from the local model, or the reason it is unavailable."""
    try:
        loaded = load_model(params.model, "sequence_classification", device=params.device,
                            dtype=params.dtype)
    except ModelLoadError as exc:
        return str(exc)
    num_labels = int(getattr(loaded.model.config, "num_labels", 1))
    if params.label >= num_labels:
        raise ValueError(f"label {params.label} is out of range: the model has "
                         f"{num_labels} label(s)")
    with loaded.lock:
        tokenizer = loaded.tokenizer
        rendered = [truncate_text_safe(tokenizer, render_ids(tokenizer, s, params),
                                       params.max_length, params.truncation_side)
                    for s in samples]
        # similar lengths together: less padding
        order = sorted(range(len(samples)), key=lambda i: len(rendered[i][0]))
        scores: list[float] = [0.0] * len(samples)
        try:
            for start in range(0, len(order), params.batch_size):
                batch = order[start:start + params.batch_size]
                values = score_ids(loaded, [rendered[i][0] for i in batch], params.label)
                for i, value in zip(batch, values):
                    scores[i] = value
        except RuntimeError as exc:  # torch's errors: out of memory, device failures
            return f"reward model failed: {type(exc).__name__}: {exc}"
    return [(scores[i], rendered[i][1], len(rendered[i][0])) for i in range(len(samples))]


def score_ids(loaded: LoadedModel, batch: list[list[int]], label: int) -> list[float]:
    """Head output ``label`` at the last real token of each (unpadded) id list, in one
    right-padded forward pass. See the module docstring for why the head is applied here."""
    import torch

    model = loaded.model
    pad = loaded.tokenizer.pad_token_id
    if pad is None:
        pad = 0  # any id: padded positions are masked and never read
    width = max(len(ids) for ids in batch)
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in batch],
                             device=loaded.device)
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in batch],
                        device=loaded.device)
    head = getattr(model, "score", None)
    with torch.inference_mode():
        if isinstance(head, torch.nn.Linear):
            hidden = model.base_model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            positions = torch.arange(width, device=mask.device)
            last = (positions * mask).argmax(dim=-1)  # highest index with mask 1
            rows = torch.arange(len(batch), device=mask.device)
            logits = head(hidden[rows, last])
        else:
            logits = model(input_ids=input_ids, attention_mask=mask).logits
    return logits[:, label].float().tolist()


# --------------------------------------------------------------------------- vLLM endpoint


def _endpoint_inputs(samples: Sequence[Sample], params: RewardModelParams
                     ) -> list[tuple[str, bool, bool | None, int | None]]:
    """Per sample: the text to send, whether the server must add special tokens to it, and
    (truncated, tokens scored) when known.

    With a tokenizer the texts are rendered and truncated here; a truncated text is sent as
    the decoding of the kept ids, special tokens written out, so the server adds none.
    Without one the plain text is sent and the server truncates (``truncate_prompt_tokens``,
    which keeps the end)."""
    if params.tokenizer is None:
        return [(plain_text(s), True, None, None) for s in samples]
    loaded = load_model(params.tokenizer, "tokenizer", device="cpu", dtype="float32")
    tokenizer = loaded.tokenizer
    inputs = []
    with loaded.lock:
        for sample in samples:
            text, add_special = render_text(tokenizer, sample, params)
            ids = list(tokenizer(text, add_special_tokens=add_special)["input_ids"])
            kept, truncated = truncate_text_safe(tokenizer, ids, params.max_length,
                                                 params.truncation_side)
            if truncated:
                text, add_special = tokenizer.decode(kept), False
            inputs.append((text, add_special, truncated, len(kept)))
    return inputs


def _score_endpoint(samples: Sequence[Sample], params: RewardModelParams) -> Scored | str:
    """Scores from ``POST {endpoint}/classify``, or the reason the endpoint is unavailable."""
    import httpx

    try:
        inputs = _endpoint_inputs(samples, params)
    except ModelLoadError as exc:
        return str(exc)
    url = params.endpoint.rstrip("/") + "/classify"
    scores: list[float] = [0.0] * len(samples)
    with httpx.Client(timeout=params.timeout_s) as client:
        # add_special_tokens is per request: texts that need it and texts that carry their
        # special tokens already go in separate requests
        for add_special in (True, False):
            indices = [i for i, item in enumerate(inputs) if item[1] is add_special]
            for start in range(0, len(indices), params.batch_size):
                chunk = indices[start:start + params.batch_size]
                body: dict[str, Any] = {
                    "input": [inputs[i][0] for i in chunk],
                    # raw logits: older vLLM reads "activation", newer "use_activation" and
                    # would otherwise apply a sigmoid to a one-label head
                    "activation": False,
                    "use_activation": False,
                    "add_special_tokens": add_special,
                }
                if params.served_model is not None:
                    body["model"] = params.served_model
                if params.tokenizer is None:
                    body["truncate_prompt_tokens"] = params.max_length
                reply = _post_with_retries(client, url, body, params)
                if isinstance(reply, str):
                    return reply
                values = _parse_classify(reply, len(chunk), params.label, url)
                if isinstance(values, str):
                    return values
                for i, value in zip(chunk, values):
                    scores[i] = value
    return [(scores[i], inputs[i][2], inputs[i][3]) for i in range(len(samples))]


def _parse_classify(reply: Any, expected: int, label: int, url: str) -> list[float] | str:
    """``data[i]["probs"][label]`` in input order, or what is wrong with the reply."""
    try:
        data = sorted(reply["data"], key=lambda d: d["index"])
        if len(data) != expected:
            return f"{url} returned {len(data)} results for {expected} inputs"
        values = []
        for item in data:
            probs = item["probs"]
            if label >= len(probs):
                return f"label {label} is out of range: {url} returned {len(probs)} class(es)"
            values.append(float(probs[label]))
        return values
    except (KeyError, TypeError, ValueError) as exc:
        return f"{url} returned an unexpected body: {type(exc).__name__}: {exc}"


_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
RETRY_MAX_S = 60.0
"""The longest wait between two attempts, a server's Retry-After included."""


def _post_with_retries(client: Any, url: str, body: dict[str, Any],
                       params: RewardModelParams) -> dict[str, Any] | str:
    """The JSON reply, or why there is none after ``max_retries`` retries."""
    import httpx

    delay = params.retry_backoff_s
    last = "no attempt"
    for attempt in range(params.max_retries + 1):
        if attempt:
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
        try:
            response = client.post(url, json=body)
        except httpx.TransportError as exc:  # refused, reset, timed out
            last = f"{type(exc).__name__}: {exc}"
            continue
        if response.status_code in _RETRY_STATUS:
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            retry_after = response.headers.get("retry-after", "")
            if retry_after.isdigit():
                delay = max(delay, min(float(retry_after), RETRY_MAX_S))
            continue
        if response.status_code != 200:
            return f"{url} answered HTTP {response.status_code}: {response.text[:200]}"
        try:
            return response.json()
        except ValueError as exc:
            return f"{url} returned invalid JSON: {exc}"
    return f"{url} kept failing after {params.max_retries + 1} attempts; last: {last}"
