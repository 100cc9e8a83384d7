"""Configuration: one settings object read from ``REWARDD_*`` environment variables.

The CLI mirrors these as flags (``rewardd serve --port 9000`` overrides ``REWARDD_PORT``);
nothing else in the code base reads the environment.
"""

from __future__ import annotations

import os
from functools import lru_cache

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of a rewardd process. Field descriptions double as the CLI help."""

    model_config = SettingsConfigDict(env_prefix="REWARDD_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address the API server binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port the API server listens on.")
    workers: int = Field(1, ge=1, description="Uvicorn worker processes for `rewardd serve`.")
    pool_size: int = Field(
        default_factory=lambda: max(1, os.cpu_count() or 1),
        ge=1, description="Verifier worker processes of the embedded executor.")
    verifier_timeout_s: float = Field(
        10.0, gt=0, description="Default wall-clock limit of one verifier call, in seconds.")
    max_verifier_timeout_s: float = Field(
        120.0, gt=0, description="Upper bound a request may set with a reward's `timeout_s`.")
    max_body_bytes: int = Field(
        256 * 1024 * 1024, gt=0, description="Largest accepted request body; larger gets 413.")
    run_state_ttl_s: float = Field(
        7 * 24 * 3600, gt=0, description="Run state (difficulty anchors, UCB statistics) "
        "expires this long after the run's last request.")
    torch_threads: int = Field(
        1, ge=1, description="Intra-op threads of torch in the API process. One by default: "
        "advantage tensors of a request are small and extra threads only contend with the "
        "event loop and the verifier workers.")
    plugins: str = Field(
        "", description="Comma-separated modules imported by the API and every verifier "
        "worker; a plugin calls verifiers.register() to add a verifier kind.")
    prometheus_multiproc_dir: str | None = Field(
        None, validation_alias=AliasChoices("REWARDD_PROMETHEUS_MULTIPROC_DIR",
                                            "PROMETHEUS_MULTIPROC_DIR"),
        description="Shared directory for metrics of several server processes "
        "(set by `rewardd serve` when --workers > 1).")
    log_level: str = Field("info", description="Log level of the server.")

    @property
    def plugin_modules(self) -> list[str]:
        return [name.strip() for name in self.plugins.split(",") if name.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
