"""Which judge backend a verifier call uses: the default, a named one, or a request's override.

Read from the environment of the process that runs the verifier (a ``gpu`` worker, or the
embedded pool), with the ``REWARDD_`` prefix like every other setting (declared, validated
and documented in :mod:`rewardd.verifiers.judge.settings`):

* ``REWARDD_JUDGE_BASE_URL``, ``REWARDD_JUDGE_MODEL``, ``REWARDD_JUDGE_API_KEY``: the default
  backend, named ``default`` (an OpenAI-compatible endpoint);
* ``REWARDD_JUDGE_BACKENDS_FILE``: a JSON object of more named backends, for example::

      {"big": {"base_url": "http://vllm:8000/v1", "model": "Qwen/Qwen3-32B",
               "api_key_env": "BIG_KEY", "max_concurrency": 64, "timeout_s": 120,
               "cost_per_1k_prompt": 0.0, "cost_per_1k_completion": 0.0},
       "tiny": {"kind": "transformers", "path": "/models/judge-1b", "batch_size": 8}}

  (``api_key_env`` names the variable holding the key: keys stay out of the file);
* ``REWARDD_JUDGE_ALLOW_REQUEST_URLS=1``: lets a request's ``backend`` override name a
  ``base_url`` of its own. Off by default: on shared infrastructure a URL from a request would
  let any tenant make the workers call any address (SSRF); a request may always pick a
  configured backend by name and change its ``model`` and sampling.

What a request chooses stays the request's: a local model path it names (a transformers
backend's ``model`` here, reward_model's ``model`` and ``tokenizer``) must lie under
``REWARDD_MODEL_ROOTS`` (:func:`check_model_path`), and a model it chooses is labelled
``request`` in the judge metrics (:data:`~rewardd.verifiers.judge.backend.REQUEST_MODEL`), never
by its own string.

Backends are built once per process and configuration, so their connection pools, caches and
loaded models are reused by every call.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rewardd.verifiers.judge.backend import REQUEST_MODEL, ChatBackend
from rewardd.verifiers.judge.fleet import state_url
from rewardd.verifiers.judge.settings import judge_settings
from rewardd.verifiers.judge.openai_compat import (DEFAULT_MAX_CONCURRENCY, OpenAIChatBackend,
                                           OpenAIConfig)

DEFAULT_BACKEND = "default"


class BackendOverride(BaseModel):
    """A request's choice of judge backend (the ``backend`` param of a judge verifier)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = DEFAULT_BACKEND
    """A configured backend: ``default`` (REWARDD_JUDGE_*) or one of REWARDD_JUDGE_BACKENDS_FILE."""
    model: str | None = None
    """Another model on the same endpoint."""
    base_url: str | None = None
    """Another endpoint (only with REWARDD_JUDGE_ALLOW_REQUEST_URLS=1)."""
    max_concurrency: int | None = Field(None, ge=1, le=1024)
    timeout_s: float | None = Field(None, gt=0, le=600)


class JudgeConfigError(ValueError):
    """The backend a call asks for is not configured (or not allowed): the judge verifiers
    report it as ``judge_unavailable`` with this message, which says what to set."""


_lock = threading.Lock()
_backends: dict[tuple[Any, ...], ChatBackend] = {}
MAX_BUILT_BACKENDS = 64
"""Backends kept built per process, least recently used dropped first: every distinct
override a request sends builds one (with its own connection pool)."""


def configured_backends(environ: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Every named backend's raw configuration: the file's, then ``default`` from the
    REWARDD_JUDGE_* variables (which wins over a ``default`` entry in the file)."""
    cfg = judge_settings(environ)
    found: dict[str, dict[str, Any]] = {}
    path = cfg.judge_backends_file
    if path:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise JudgeConfigError(f"REWARDD_JUDGE_BACKENDS_FILE={path}: {exc}") from None
        if not isinstance(data, dict):
            raise JudgeConfigError(f"REWARDD_JUDGE_BACKENDS_FILE={path}: expected a JSON object "
                                   "of named backends")
        for name, entry in data.items():
            if not isinstance(entry, dict):
                raise JudgeConfigError(f"REWARDD_JUDGE_BACKENDS_FILE={path}: backend {name!r} "
                                       f"is {type(entry).__name__}, expected a JSON object of "
                                       "settings")
            found[str(name)] = dict(entry)
    if cfg.judge_base_url:
        found[DEFAULT_BACKEND] = {"base_url": cfg.judge_base_url, "model": cfg.judge_model,
                                  "api_key": cfg.judge_api_key}
    return found


def resolve_backend(override: BackendOverride | None,
                    environ: Mapping[str, str] | None = None) -> ChatBackend:
    """The backend for one call, built on first use in this process."""
    env = os.environ if environ is None else environ
    choice = override or BackendOverride()
    raw = configured_backends(env).get(choice.name)
    if raw is None:
        names = ", ".join(sorted(configured_backends(env))) or "none"
        hint = ("set REWARDD_JUDGE_BASE_URL and REWARDD_JUDGE_MODEL on the workers"
                if choice.name == DEFAULT_BACKEND else "add it to REWARDD_JUDGE_BACKENDS_FILE")
        raise JudgeConfigError(f"no judge backend named {choice.name!r} is configured "
                               f"(configured: {names}); {hint}")
    raw = dict(raw)
    configured_model = raw.get("model")
    if raw.get("kind") == "transformers" and choice.model is not None:
        # a request may not load any directory; what loads is the confined real path
        choice = choice.model_copy(update={"model": check_model_path(
            choice.model, env, field="backend.model")})
    if choice.base_url is not None:
        if not request_urls_allowed(environ):
            raise JudgeConfigError("a request may not name a judge base_url unless the "
                                   "service sets REWARDD_JUDGE_ALLOW_REQUEST_URLS=1; pick a "
                                   "configured backend by name instead")
        raw["base_url"] = choice.base_url
    overridden = any(getattr(choice, f) is not None for f in ("model", "max_concurrency",
                                                               "timeout_s", "base_url"))
    if overridden and raw.get("kind", "openai") == "openai":
        # a request may lower the operator's bound, never raise it, and its backend shares
        # the configured one's bound in this process
        try:
            configured = int(raw.get("max_concurrency", DEFAULT_MAX_CONCURRENCY))
        except (TypeError, ValueError):
            raise JudgeConfigError(f"judge backend {choice.name!r}: max_concurrency is "
                                   f"{raw.get('max_concurrency')!r}, not a number") from None
        raw["endpoint_max_concurrency"] = configured
        if choice.max_concurrency is not None:
            raw["max_concurrency"] = min(choice.max_concurrency, configured)
    for field in ("model", "timeout_s"):
        if getattr(choice, field) is not None:
            raw[field] = getattr(choice, field)
    cfg = judge_settings(environ)
    if cfg.judge_cache_url and raw.get("kind", "openai") == "openai":
        raw.setdefault("shared_cache_url", cfg.judge_cache_url)
        if cfg.judge_cache_ttl_s is not None:
            raw.setdefault("shared_cache_ttl_s", cfg.judge_cache_ttl_s)
    key = (choice.name, json.dumps(raw, sort_keys=True, default=str))
    chosen_model = raw.get("model") != configured_model  # labelled REQUEST_MODEL in metrics
    with _lock:
        backend = _backends.pop(key, None)
        if backend is None:
            backend = _build(choice.name, raw, env)
            backend.metric_model = REQUEST_MODEL if chosen_model else None
        _backends[key] = backend  # most recently used last
        while len(_backends) > MAX_BUILT_BACKENDS:
            _backends.pop(next(iter(_backends)))
        return backend


def _build(name: str, raw: dict[str, Any], env: Mapping[str, str]) -> ChatBackend:
    kind = raw.pop("kind", "openai")
    if kind == "transformers":
        from rewardd.verifiers.judge.local import TransformersChatBackend

        allowed = {"model", "device", "dtype", "batch_size"}
        unknown = set(raw) - allowed
        if unknown or "model" not in raw:
            raise JudgeConfigError(f"judge backend {name!r} (transformers) takes model (a local "
                                   f"directory), device, dtype and batch_size; got "
                                   f"{', '.join(sorted(raw))}")
        return TransformersChatBackend(name=name, **raw)
    if kind != "openai":
        raise JudgeConfigError(f"judge backend {name!r}: unknown kind {kind!r} "
                               "(openai or transformers)")
    key_env = raw.pop("api_key_env", None)
    if key_env and not raw.get("api_key"):
        raw["api_key"] = env.get(key_env)
    if not raw.get("base_url"):
        raise JudgeConfigError(f"judge backend {name!r} has no base_url")
    if raw.get("fleet_max_concurrency") is not None:
        raw.setdefault("state_url", state_url(dict(env)))
    try:
        return OpenAIChatBackend(OpenAIConfig(name=name, **raw))
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}"
                            for e in exc.errors())
        raise JudgeConfigError(f"judge backend {name!r}: {reasons}") from None
    except (TypeError, ValueError) as exc:
        raise JudgeConfigError(f"judge backend {name!r}: {exc}") from None


def check_model_path(path: str, environ: Mapping[str, str] | None = None, *,
                     field: str = "model") -> str:
    """The real path of a local model file or directory a request names (``field`` says
    which: ``model``, ``tokenizer``, ``backend.model``), if it lies under one of
    ``REWARDD_MODEL_ROOTS`` (directories separated by ``:``); else :class:`JudgeConfigError`.
    Without the allow-list a request could make every worker load any directory.

    Every request-named path goes through here, and the caller loads the path returned, not
    the one given: symlinks and ``..`` are resolved first (``os.path.realpath``: a link under
    a root that points outside is outside; ``root/x/../../etc`` is ``/etc``), so what is
    checked is what is opened. The refusal is decided on the path's text and the links it
    passes through, and its wording never depends on whether the path exists: a tenant
    cannot probe the worker's file system (an earlier ``tokenizer`` went to the loader
    unchecked, whose errors told "not a local directory" from "cannot load")."""
    roots = [os.path.realpath(r) for r in judge_settings(environ).model_roots.split(os.pathsep)
             if r.strip()]
    if not roots:
        raise JudgeConfigError(f"{field} {path!r}: local models are loaded only from "
                               "REWARDD_MODEL_ROOTS (the directories holding your models, "
                               "separated by ':'), which is not set on this worker")
    real = os.path.realpath(path)
    if not any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots):
        raise JudgeConfigError(f"{field} {path!r} is not under REWARDD_MODEL_ROOTS "
                               f"({', '.join(roots)}), symlinks and '..' resolved; give a "
                               "path inside one of them")
    return real


def request_urls_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """REWARDD_JUDGE_ALLOW_REQUEST_URLS is on: requests may name endpoints of their own."""
    return judge_settings(environ).judge_allow_request_urls


def check_endpoint(url: str, environ: Mapping[str, str] | None = None) -> None:
    """Allow a request's model endpoint only if it is one of ``REWARDD_MODEL_ENDPOINTS``
    (base URLs separated by ``,``) or REWARDD_JUDGE_ALLOW_REQUEST_URLS=1; else
    :class:`JudgeConfigError` (a URL from a request is an SSRF on shared infrastructure)."""
    cfg = judge_settings(environ)
    if cfg.judge_allow_request_urls:
        return
    allowed = {u.strip().rstrip("/") for u in cfg.model_endpoints.split(",") if u.strip()}
    if url.rstrip("/") not in allowed:
        raise JudgeConfigError(f"endpoint {url!r} is not one of REWARDD_MODEL_ENDPOINTS; add it "
                               "there (or set REWARDD_JUDGE_ALLOW_REQUEST_URLS=1)")


def reset_backends() -> None:
    """Forget built backends (tests that change the environment)."""
    with _lock:
        _backends.clear()
