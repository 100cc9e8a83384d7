"""Run OpenRLHF 0.11.2's own reward-function path on scripted generations; write what it kept.

Runs under the OpenRLHF environment's python (make test-openrlhf-slime). OpenRLHF's
``SingleTurnAgentExecutor`` is built as its vLLM engine actor builds it (the
``--reward.remote_url`` value split on commas), so it imports the reward file by path; then
``execute`` tokenizes each prompt with a real tokenizer, takes the generation, decodes prompt
+ response and calls the file's ``reward_func`` in a thread, exactly as in training. Only
vLLM's engine is replaced: ``ScriptedEngine.generate`` answers each prompt with the text the
test chose (its real token ids, then EOS, finish_reason "stop"), as vLLM's RequestOutput does.

Usage: openrlhf_reward_func.py REWARD_FILE TOKENIZER_DIR CASES_JSON OUT_JSON, where CASES_JSON
holds [{"prompt", "label", "response"}, ...]; OUT_JSON receives, per case, the reward and
score as OpenRLHF's experience maker turns them into tensors (``torch.tensor([value])``) and
the extra logs.
"""

from __future__ import annotations

import asyncio
import json
import sys
from types import SimpleNamespace

import torch
from openrlhf.utils.agent import SingleTurnAgentExecutor
from transformers import AutoTokenizer


class ScriptedEngine:
    """Stands in for vLLM's engine: ``generate(prompt_token_ids, sampling_params,
    multi_modal_data)`` returns a RequestOutput-shaped answer for the scripted response."""

    def __init__(self, tokenizer, responses: dict[str, str]) -> None:
        self.tokenizer = tokenizer
        self.by_prompt_ids = {tuple(tokenizer(text=p, add_special_tokens=False)["input_ids"]): r
                              for p, r in responses.items()}

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        text = self.by_prompt_ids[tuple(prompt_token_ids)]
        ids = self.tokenizer(text=text, add_special_tokens=False)["input_ids"]
        ids = ids + [self.tokenizer.eos_token_id]
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, text=text,
                                                        finish_reason="stop", logprobs=None)])


def as_number(value):
    # what SamplesGenerator._process_response_into_experience does with reward and scores
    return None if value is None else torch.tensor([value]).tolist()


async def run(reward_file: str, tokenizer_dir: str, cases: list[dict]) -> list[dict]:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    # train_ppo_ray: args.reward.remote_url = args.reward.remote_url.split(",")
    executor = SingleTurnAgentExecutor(remote_rm_url=reward_file.split(","))
    assert executor.reward_func is not None, "OpenRLHF did not load the reward file"
    results = []
    for case in cases:
        # one engine per case: a prompt may recur with another response
        engine = ScriptedEngine(tokenizer, {case["prompt"]: case["response"]})
        params = SimpleNamespace(max_tokens=64, logprobs=None)
        out = await executor.execute(case["prompt"], case["label"], params, max_length=256,
                                     hf_tokenizer=tokenizer, llm_engine=engine)
        results.append({
            "reward": as_number(out["reward"]),
            "scores": as_number(out["scores"]),
            "extra_logs": {k: torch.as_tensor(v).flatten().tolist()
                           for k, v in out["extra_logs"].items()},
            "query_tail": tokenizer.decode(out["observation_tokens"][-3:],
                                           skip_special_tokens=False),
        })
    return results


def main() -> None:
    reward_file, tokenizer_dir, cases_path, out_path = sys.argv[1:5]
    with open(cases_path, encoding="utf-8") as handle:
        cases = json.load(handle)
    results = asyncio.run(run(reward_file, tokenizer_dir, cases))
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main()
