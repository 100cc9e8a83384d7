"""Streaming sessions (/v1/sessions): rollouts scored as they arrive, advantages per completed
group. Built under issue #18."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/v1", tags=["sessions"])
