"""Records to write in the record's tests."""

from __future__ import annotations

from rewardd.service.records.models import RolloutRecord, Verdict


def rollout(run: str = "run-1", step: int | None = 0, index: int = 0, tenant: str = "acme",
            source: str | None = "gsm8k", math_ok: bool = True, at: float = 1000.0,
            completion: str | None = "The answer is 4.", num_tokens: int | None = 8,
            zero_advantage: bool | None = False) -> RolloutRecord:
    math = (Verdict("math", 1.0, "ok", {"ok": True, "evidence": {"extracted": "4"}})
            if math_ok else
            Verdict("math", None, "timeout", {"ok": False, "error": "timeout"}))
    return RolloutRecord(
        tenant=tenant, run_id=run, group_id=f"g{index // 2}", rollout_id=f"r{index}",
        verdicts=(Verdict("format", 0.5, "ok", {"ok": True}), math), recorded_at=at,
        step=step, source=source, summary={"reward": 1.5, "advantage_mean": 0.25}, completion=completion,
        num_tokens=num_tokens, zero_advantage=zero_advantage)
