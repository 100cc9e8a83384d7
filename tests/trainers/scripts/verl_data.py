"""Inputs for the verl checks, built the way verl builds them: a tokenizer saved to a folder
(verl's reward workers load it by path), a ``DataProto`` rollout batch (left-padded prompts,
right-padded responses, ``uid``/``reward_model``/``data_source`` columns) and the slice of
verl's trainer config the reward loop reads. Runs in the verl environment only.

The tokenizer is byte-level BPE trained here on a few sentences (nothing is downloaded):
any text encodes and decodes back exactly, which is all verl's reward path asks of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from omegaconf import OmegaConf
from verl import DataProto

PAD, EOS = "<pad>", "</s>"
CORPUS = ("What is 1+1? The answer is \\boxed{2}.", "Compute 2*3; so \\boxed{6}, not 5.",
          "tool output: 7 9 11 13")


def save_tokenizer(folder: Path) -> Any:
    """A byte-level BPE tokenizer saved as a transformers tokenizer in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(CORPUS, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=[PAD, EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD,
                            eos_token=EOS).save_pretrained(str(folder))
    return AutoTokenizer.from_pretrained(str(folder))


def batch(tokenizer: Any, rows: Sequence[tuple[str, str, str, Any]], prompt_len: int = 32,
          response_len: int = 24) -> DataProto:
    """A DataProto of ``rows`` = (uid, prompt, response, ground_truth): prompts left-padded to
    ``prompt_len``, responses (ending in EOS) right-padded to ``response_len``."""
    pad = tokenizer.pad_token_id
    prompts, responses, attention = [], [], []
    for _, prompt, response, _ in rows:
        p = tokenizer.encode(prompt, add_special_tokens=False)
        r = tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]
        assert len(p) <= prompt_len and len(r) <= response_len, (prompt, response)
        prompts.append([pad] * (prompt_len - len(p)) + p)
        responses.append(r + [pad] * (response_len - len(r)))
        attention.append([0] * (prompt_len - len(p)) + [1] * (len(p) + len(r))
                         + [0] * (response_len - len(r)))
    prompts_t, responses_t = torch.tensor(prompts), torch.tensor(responses)
    attention_t = torch.tensor(attention)
    return DataProto.from_dict(
        tensors={"prompts": prompts_t, "responses": responses_t,
                 "input_ids": torch.cat([prompts_t, responses_t], dim=1),
                 "attention_mask": attention_t,
                 "response_mask": attention_t[:, prompt_len:]},
        non_tensors={"uid": np.array([r[0] for r in rows], dtype=object),
                     "data_source": np.array(["openai/gsm8k"] * len(rows), dtype=object),
                     "reward_model": np.array([{"ground_truth": r[3], "style": "rule"}
                                               for r in rows], dtype=object),
                     "extra_info": np.array([{"index": i} for i in range(len(rows))],
                                            dtype=object)})


def config(tokenizer_dir: Path, **reward: Any) -> Any:
    """The part of verl's PPO config (ppo_trainer.yaml, ``reward`` section as in 0.9.1) that
    the reward loop reads, with ``reward`` keys merged in."""
    base = {
        "actor_rollout_ref": {"model": {"path": str(tokenizer_dir), "tokenizer_path": None}},
        "reward": {
            "num_workers": 1,
            "custom_reward_function": {"path": None, "name": "compute_score"},
            "reward_manager": {"source": "register", "name": "naive",
                               "module": {"path": None, "name": "custom_reward_manager"}},
            "reward_model": {"enable": False, "model_path": None},
            "sandbox_fusion": {"url": None},
        },
    }
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create({"reward": reward}))


# (uid, prompt, response, ground truth): two prompts of three rollouts, right and wrong
MATH_ROWS = (
    ("uid-a", "What is 1+1?", "The answer is \\boxed{2}.", "2"),
    ("uid-a", "What is 1+1?", "I think \\boxed{3}.", "2"),
    ("uid-a", "What is 1+1?", "so \\boxed{2}", "2"),
    ("uid-b", "Compute 2*3.", "\\boxed{5}", "6"),
    ("uid-b", "Compute 2*3.", "Then \\boxed{6}.", "6"),
    ("uid-b", "Compute 2*3.", "no idea", "6"),
)
MATH_EXPECTED = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
