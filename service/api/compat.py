"""Per-sample trainer protocols (OpenRLHF /get_reward, slime, NeMo-Gym /verify) fed into
sessions. Built under issue #18."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["compat"])
