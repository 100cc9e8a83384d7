"""Local transformers models for the judges: a per-process model cache and a generative backend.

A ``gpu`` worker hosts a model the way this module does: loaded once per worker process (the
first call pays for it, every later call and every backend instance reuses it), requests run
as padded batches. The cache is shared with :mod:`rewardd.verifiers.judge.reward_model`.

torch and transformers are imported inside functions only: CPU-only workers import the
verifier registry, which imports this module, and must not pay for (or need) torch there.

Why a hand-written generation loop around ``model.generate`` rather than transformers'
``pipeline("text-generation")``: the judge needs, per request, the prompt and completion token
counts and the finish reason (for :class:`~rewardd.verifiers.judge.backend.Usage` and for telling a
cut-off verdict from a finished one), a per-request seed whose draws do not depend on which
other requests share the batch, and control over batch composition (requests grouped by
``max_tokens``, sorted by length). The pipeline returns only text, samples from the global
RNG, and batches by its own rules.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from rewardd.verifiers.judge.backend import (ChatBackend, ChatReply, ChatRequest, ChatResult,
                                     JudgeUnavailable)

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
ModelKind = Literal["causal_lm", "sequence_classification", "tokenizer"]


class ModelLoadError(RuntimeError):
    """A local model or tokenizer could not be loaded (missing files, bad config, out of memory)."""


@dataclass(slots=True)
class LoadedModel:
    """One cached model (None for ``kind="tokenizer"``) with its tokenizer.

    ``lock`` serialises use of the model: one batch at a time per model and process, which is
    what a single accelerator can run anyway, and it keeps the (stateful, Rust-backed)
    tokenizer from being used by two threads at once.
    """

    kind: ModelKind
    path: str
    device: str
    dtype: str
    model: Any
    tokenizer: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    grammar_compiler: Any = None
    """xgrammar's compiler for this tokenizer, made on the first structured request."""


_CACHE: dict[tuple[str, str, str, str], LoadedModel] = {}
_CACHE_LOCK = threading.Lock()
_LOAD_LOCKS: dict[tuple[str, str, str, str], threading.Lock] = {}


def _after_fork_in_child() -> None:
    """A forked worker cannot use its parent's CUDA context, and may inherit a lock that a
    parent thread held at fork time: drop GPU entries and give every survivor fresh locks."""
    global _CACHE_LOCK
    _CACHE_LOCK = threading.Lock()
    _LOAD_LOCKS.clear()
    for key, entry in list(_CACHE.items()):
        if entry.device != "cpu":
            del _CACHE[key]
        else:
            entry.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def resolve_device(device: str | None) -> str:
    """``device`` as given, or "cuda" when an accelerator is visible, else "cpu"."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: Dtype, device: str) -> str:
    """"auto" is bfloat16 on a GPU that supports it (the usual serving precision) and float32
    elsewhere (CPUs are slow and inexact in half precision)."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


def load_model(path: str, kind: ModelKind, *, device: str | None = None,
               dtype: Dtype = "auto") -> LoadedModel:
    """The cached model of ``kind`` at local directory ``path``, loading it on first use.

    Keyed by (kind, real path, device, dtype); thread-safe, and two threads asking for the same
    model load it once. Only local files are read (no hub), no remote code runs, and only
    safetensors weights are accepted (a pickled checkpoint could run code on load). A failure
    is not cached: the next call tries again. Raises :class:`ModelLoadError`.
    """
    try:
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
    except Exception as exc:  # torch missing or broken: the model cannot be hosted here
        raise ModelLoadError(f"cannot set up a device for {path!r}: "
                             f"{type(exc).__name__}: {exc}") from exc
    key = (kind, os.path.realpath(path), device, dtype)
    with _CACHE_LOCK:
        entry = _CACHE.get(key)
        if entry is not None:
            return entry
        load_lock = _LOAD_LOCKS.setdefault(key, threading.Lock())
    with load_lock:
        with _CACHE_LOCK:
            entry = _CACHE.get(key)
        if entry is None:
            entry = _load(key)
            with _CACHE_LOCK:
                _CACHE[key] = entry
        return entry


def cached_models() -> dict[tuple[str, str, str, str], LoadedModel]:
    """A snapshot of the cache: (kind, path, device, dtype) -> entry."""
    with _CACHE_LOCK:
        return dict(_CACHE)


def _load(key: tuple[str, str, str, str]) -> LoadedModel:
    kind, path, device, dtype = key
    if not os.path.isdir(path):
        raise ModelLoadError(f"model path {path!r} is not a local directory")
    try:
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=False)
        model = None
        if kind != "tokenizer":
            import torch
            from packaging.version import Version

            auto = (transformers.AutoModelForCausalLM if kind == "causal_lm"
                    else transformers.AutoModelForSequenceClassification)
            # transformers renamed torch_dtype to dtype in 4.56
            dtype_kw = ("dtype" if Version(transformers.__version__) >= Version("4.56")
                        else "torch_dtype")
            model = auto.from_pretrained(path, local_files_only=True, trust_remote_code=False,
                                         use_safetensors=True,
                                         **{dtype_kw: getattr(torch, dtype)})
            model.to(device)
            model.eval()
    except Exception as exc:  # every way a load fails is the same for the caller
        raise ModelLoadError(f"cannot load {kind} from {path!r}: "
                             f"{type(exc).__name__}: {exc}") from exc
    return LoadedModel(kind=kind, path=path, device=device, dtype=dtype, model=model,
                       tokenizer=tokenizer)


def _eos_ids(loaded: LoadedModel) -> list[int]:
    """End-of-sequence ids: the model's generation config (may list several, e.g. an
    end-of-turn token besides EOS), else the tokenizer's EOS."""
    eos = getattr(getattr(loaded.model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = loaded.tokenizer.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


class StructuredOutputUnavailable(RuntimeError):
    """A request's ``json_schema`` cannot be enforced (xgrammar missing, a bad schema)."""


def _compiled_schema(loaded: LoadedModel, schema: Any) -> Any:
    """The request's JSON schema compiled to a grammar over this model's vocabulary.

    xgrammar (the structured-output engine vLLM and SGLang use) does the work: turning a
    JSON schema into a token-level automaton for a byte-level or sentencepiece vocabulary
    is what it exists for. Compact JSON (no free whitespace, as with ``any_whitespace``
    off in vLLM): a small model offered free whitespace tends to emit it until
    ``max_tokens``. Compiled grammars are cached by xgrammar per compiler."""
    try:
        import xgrammar
    except ImportError:
        raise StructuredOutputUnavailable(
            "structured output (json_schema) on a local model needs xgrammar: "
            "pip install 'rewardd[models]'") from None
    if loaded.grammar_compiler is None:
        info = xgrammar.TokenizerInfo.from_huggingface(
            loaded.tokenizer, vocab_size=loaded.model.config.vocab_size,
            stop_token_ids=_eos_ids(loaded) or None)
        loaded.grammar_compiler = xgrammar.GrammarCompiler(info)
    try:
        # the schema's own property order: a judge's explanation before its verdict stays so
        return loaded.grammar_compiler.compile_json_schema(json.dumps(schema),
                                                           any_whitespace=False)
    except Exception as exc:  # xgrammar raises RuntimeError/ValueError on bad schemas
        raise StructuredOutputUnavailable(
            f"json_schema cannot be compiled: {str(exc).strip()}") from None


class _GrammarMask:
    """A logits processor that lets each constrained row take only the tokens its grammar
    allows next (the rows without a schema are left alone). It runs before the sampler, so a
    sampled row draws from the allowed tokens only; the end-of-sequence token is allowed once
    the JSON is complete."""

    def __init__(self, grammars: Sequence[Any], vocab_size: int) -> None:
        import xgrammar

        self.xgrammar = xgrammar
        self.matchers = {i: xgrammar.GrammarMatcher(g) for i, g in enumerate(grammars)
                         if g is not None}
        self.bitmask = xgrammar.allocate_token_bitmask(len(grammars), vocab_size)
        self.vocab_size = vocab_size
        self.steps = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.steps:  # the token each row took last step
            for i, matcher in self.matchers.items():
                if not matcher.is_terminated():
                    matcher.accept_token(int(input_ids[i, -1]))
        self.steps += 1
        rows = [i for i, matcher in self.matchers.items() if not matcher.is_terminated()]
        for i in rows:
            self.matchers[i].fill_next_token_bitmask(self.bitmask, i)
        if rows:
            device_mask = self.bitmask.to(scores.device, non_blocking=True)
            self.xgrammar.apply_token_bitmask_inplace(scores, device_mask, indices=rows,
                                                      vocab_size=self.vocab_size)
        return scores


class _PerRowSampler:
    """A logits processor that samples each row with its own temperature, top-p and generator.

    It puts -inf on every token but the one drawn, so ``generate`` in greedy mode takes exactly
    that token. Rows with temperature 0 are left alone (plain greedy). Each row draws from its
    own ``torch.Generator`` once per step, so a seeded request gets the same tokens whatever
    else shares its batch (up to the numerics of padding).
    """

    def __init__(self, requests: Sequence[ChatRequest], device: str) -> None:
        import torch

        self.rows: list[tuple[int, float, float, Any]] = []
        for i, req in enumerate(requests):
            if req.temperature > 0:
                gen = torch.Generator(device=device)
                if req.seed is None:
                    gen.seed()
                else:
                    gen.manual_seed(req.seed)
                self.rows.append((i, req.temperature, req.top_p, gen))

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        for i, temperature, top_p, gen in self.rows:
            probs = torch.softmax(scores[i].float() / temperature, dim=-1)
            if top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                # keep the smallest prefix whose mass reaches top_p (always the top token)
                drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= top_p
                drop[0] = False
                sorted_probs[drop] = 0.0
                probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
            token = torch.multinomial(probs, 1, generator=gen)
            row = torch.full_like(scores[i], -math.inf)
            row[token] = 0.0
            scores[i] = row
        return scores


class TransformersChatBackend(ChatBackend):
    """A generative judge on a local transformers causal LM (:meth:`chat` batches requests).

    The model loads on the first :meth:`chat` (or :meth:`load`) and is shared through the
    process-wide cache with every other backend on the same (path, device, dtype).

    Requests are rendered with the tokenizer's chat template (generation prompt added), grouped
    by ``max_tokens``, sorted by length and run in left-padded batches of ``batch_size``.
    Temperature 0 is greedy; otherwise each request samples with temperature and top-p from a
    generator seeded with its ``seed`` (a random seed when None). Other decoding settings
    (repetition penalty and the like) follow the model's ``generation_config``, as vLLM does.
    A request's ``json_schema`` is enforced by grammar-constrained decoding (xgrammar, as in
    vLLM): the answer is compact JSON that the schema accepts, unless ``max_tokens`` cuts it
    off first (``finish_reason`` "length"). The verifier still parses and validates it.

    Usage: ``prompt_tokens`` counts the rendered prompt without padding; ``completion_tokens``
    counts generated tokens up to and including the end-of-sequence token (as vLLM counts
    them), whose text is not part of the reply. ``finish_reason`` is "stop" when an
    end-of-sequence token ended the answer, "length" when ``max_tokens`` did.
    """

    def __init__(self, model: str, *, device: str | None = None, dtype: Dtype = "auto",
                 batch_size: int = 8, name: str = "transformers") -> None:
        """``model``: local directory of the model (weights, tokenizer with a chat template);
        ``device``: torch device, None for cuda when available else cpu; ``dtype``: weight
        precision ("auto": bfloat16 on a GPU, float32 on a CPU); ``batch_size``: requests
        per ``generate`` call; ``name``: the backend's name in usage reports."""
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.model = model
        self.name = name
        self.device = device
        self.dtype: Dtype = dtype
        self.batch_size = batch_size

    def load(self) -> LoadedModel:
        """The cached model and tokenizer (loading them if needed); raises ModelLoadError."""
        return load_model(self.model, "causal_lm", device=self.device, dtype=self.dtype)

    def chat(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        results: list[ChatResult | None] = [None] * len(requests)
        if not requests:
            return []
        try:
            loaded = self.load()
        except ModelLoadError as exc:
            return [JudgeUnavailable(str(exc)) for _ in requests]
        with loaded.lock:
            prompts: dict[int, list[int]] = {}
            grammars: dict[int, Any] = {}
            limit = getattr(loaded.model.config, "max_position_embeddings", None)
            for i, req in enumerate(requests):
                try:
                    prompts[i] = self._render(loaded, req)
                except Exception as exc:  # a template that rejects these messages
                    results[i] = JudgeUnavailable(
                        f"cannot render the chat template: {type(exc).__name__}: {exc}")
                    continue
                if limit is not None and len(prompts[i]) + req.max_tokens > limit:
                    results[i] = JudgeUnavailable(
                        f"prompt of {len(prompts[i])} tokens plus max_tokens={req.max_tokens} "
                        f"exceeds the model's {limit} positions")
                    del prompts[i]
                    continue
                if req.json_schema is not None:
                    try:
                        grammars[i] = _compiled_schema(loaded, req.json_schema)
                    except StructuredOutputUnavailable as exc:
                        results[i] = JudgeUnavailable(str(exc))
                        del prompts[i]
            by_max_tokens: dict[int, list[int]] = {}
            for i in sorted(prompts, key=lambda i: len(prompts[i])):
                by_max_tokens.setdefault(requests[i].max_tokens, []).append(i)
            for indices in by_max_tokens.values():
                for start in range(0, len(indices), self.batch_size):
                    batch = indices[start:start + self.batch_size]
                    replies = self._generate(loaded, [requests[i] for i in batch],
                                             [prompts[i] for i in batch],
                                             [grammars.get(i) for i in batch])
                    for i, reply in zip(batch, replies):
                        results[i] = reply
        return [r if r is not None else JudgeUnavailable("no result") for r in results]

    @staticmethod
    def _render(loaded: LoadedModel, request: ChatRequest) -> list[int]:
        tokenizer = loaded.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer of {loaded.path!r} has no chat template")
        text = tokenizer.apply_chat_template(
            [{"role": role, "content": content} for role, content in request.messages],
            tokenize=False, add_generation_prompt=True)
        # the template writes BOS itself (as apply_chat_template(tokenize=True) assumes)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def _generate(self, loaded: LoadedModel, requests: list[ChatRequest],
                  prompts: list[list[int]], grammars: list[Any]) -> list[ChatResult]:
        """One left-padded batch; all requests share ``max_tokens``. An out-of-memory error
        splits the batch in two and tries again; any other error fails the whole batch."""
        try:
            return self._generate_batch(loaded, requests, prompts, grammars)
        except Exception as exc:
            import torch

            if isinstance(exc, torch.OutOfMemoryError) and len(requests) > 1:
                torch.cuda.empty_cache()
                half = len(requests) // 2
                return (self._generate(loaded, requests[:half], prompts[:half], grammars[:half])
                        + self._generate(loaded, requests[half:], prompts[half:],
                                         grammars[half:]))
            return [JudgeUnavailable(f"generation failed: {type(exc).__name__}: {exc}")
                    for _ in requests]

    def _generate_batch(self, loaded: LoadedModel, requests: list[ChatRequest],
                        prompts: list[list[int]], grammars: list[Any]) -> list[ChatResult]:
        import torch
        from transformers import LogitsProcessorList

        tokenizer = loaded.tokenizer
        eos = _eos_ids(loaded)
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = eos[0] if eos else 0
        width = max(len(p) for p in prompts)
        # left padding built by hand, so the shared tokenizer's padding_side is never mutated
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts],
                                 device=loaded.device)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                                      device=loaded.device)
        processors: list[Any] = []
        if any(g is not None for g in grammars):  # the mask first: the sampler draws after it
            processors.append(_GrammarMask(grammars, loaded.model.config.vocab_size))
        sampler = _PerRowSampler(requests, loaded.device)
        if sampler.rows:
            processors.append(sampler)
        max_tokens = requests[0].max_tokens
        with torch.inference_mode():
            # all settings as keyword arguments: they override the model's generation_config
            # in every transformers version (a GenerationConfig object merges differently)
            output = loaded.model.generate(
                input_ids=input_ids, attention_mask=attention_mask,
                max_new_tokens=max_tokens, min_new_tokens=0, do_sample=False, num_beams=1,
                pad_token_id=pad, eos_token_id=eos or None,
                logits_processor=LogitsProcessorList(processors))
        new_tokens = output[:, width:].tolist()
        eos_set = set(eos)
        replies: list[ChatResult] = []
        for prompt, tokens in zip(prompts, new_tokens):
            stop = next((j for j, t in enumerate(tokens) if t in eos_set), None)
            if stop is None:
                kept, count, reason = tokens[:max_tokens], min(len(tokens), max_tokens), "length"
            else:
                kept, count, reason = tokens[:stop], stop + 1, "stop"
            text = tokenizer.decode(kept, skip_special_tokens=True)
            replies.append(ChatReply(text=text, finish_reason=reason, prompt_tokens=len(prompt),
                                     completion_tokens=count))
        return replies
