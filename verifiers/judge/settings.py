"""The operator's judge and model settings: endpoints, keys, where local models may live.

They live in the verifier layer because the judge verifiers read them in whatever process
runs them (a ``gpu`` worker, or the embedded pool) and the layers import downward only;
:class:`rewardd.workers.settings.WorkerSettings` extends this class, so they are validated
with every other setting at start (a typo in a name or a value stops the process there) and
listed in the same table. :func:`judge_settings` reads them per use, not once per process:
tests and a test's judge server change them between calls, and a judge call's network round
trip dwarfs the read.
"""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class JudgeSettings(BaseSettings):
    """Judge backends and model access. Descriptions double as the CLI help."""

    model_config = SettingsConfigDict(env_prefix="REWARDD_", extra="ignore")

    judge_base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint of the `default` judge backend "
        "(e.g. http://vllm:8000/v1). Unset: no default backend.")
    judge_model: str = Field("default", description="Model the `default` judge backend asks for.")
    judge_api_key: str | None = Field(
        None, description="API key of the `default` judge backend.")
    judge_backends_file: str | None = Field(
        None, description="JSON file of more named judge backends (openai or transformers; "
        "see verifiers/judge/config.py).")
    judge_allow_request_urls: bool = Field(
        False, description="Lets a request name a judge `base_url` or model endpoint of its "
        "own. Off by default: on shared infrastructure it lets any tenant make the workers "
        "call any address (SSRF).")
    judge_cache_url: str | None = Field(
        None, description="Redis shared by every worker as a cache of judge answers (openai "
        "backends). Unset: each process caches its own.")
    judge_cache_ttl_s: float | None = Field(
        None, gt=0, description="Lifetime of an entry of the shared judge cache, in seconds. "
        "Unset: the backend's default.")
    judge_state_url: str | None = Field(
        None, description="Redis holding the fleet-wide bound of judge requests in flight "
        "(`fleet_max_concurrency`). Default: REWARDD_STATE_URL, else the broker.")
    model_roots: str = Field(
        "", description="Directories (separated by `:`) under which a request may name a "
        "local model or tokenizer (transformers judge, reward_model). Unset: none may.")
    model_endpoints: str = Field(
        "", description="Model endpoints (base URLs, comma-separated) a request may name "
        "without REWARDD_JUDGE_ALLOW_REQUEST_URLS.")


def judge_settings(environ: Mapping[str, str] | None = None) -> JudgeSettings:
    """The judge settings from the process environment, or from ``environ`` alone (every
    field given, so the process environment is not consulted)."""
    if environ is None:
        return JudgeSettings()
    values: dict[str, Any] = {}
    for name, field in JudgeSettings.model_fields.items():
        variable = f"REWARDD_{name.upper()}"
        values[name] = environ[variable] if variable in environ else field.default
    return JudgeSettings(**values)
