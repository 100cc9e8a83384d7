"""Train the tiny Qwen2 with TRL's real GRPOTrainer for 2 steps, rewards from rewardd.

    torchrun --nproc_per_node 2 tests/trainers/scripts/trl_grpo.py \\
        --model DIR --url URL --out DIR --mode {trl,tempo}

Two processes (gloo on CPU), num_generations 4, per-device batch 6: every batch holds three
prompts and the middle one is split across the processes ([4, 2] and [2, 4]).

- ``--mode trl``: plain prompts; one TRL reward function per component
  (``reward_functions``), so TRL's own advantages are the ones to compare with rewardd's
  ``profile: "trl"``. One prompt's answer is empty: its math cells fail (None).
- ``--mode tempo``: chat prompts; one async reward function; the trainer trains on rewardd's
  per-token ``tempo`` advantages (``rewardd_advantages``, one ``POST /v1/score`` per step);
  ``--estimator`` names another entry (an unknown one, with ``--no-validate``, shows how a
  refused request ends every process).

Each process writes ``rank<r>.json`` into ``--out``: what it saw (prompts, completions,
token ids, the gathered rewards of each reward function, the advantages TRL's batch carried,
and the inputs of every ``_compute_loss`` call) and the trainer's log history; or, when
training raised, ``rank<r>.error`` with the exception. Those wrappers
only record; every step of TRL runs as it is.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl_model import load_tokenizer

from rewardd_client._groups import runs_of_equal
from rewardd_client.trl import async_reward_function, reward_functions, rewardd_advantages

REWARDS = [{"name": "math", "verifier": "math"},
           {"name": "length", "verifier": "length",
            "params": {"unit": "tokens", "max_length": 6, "buffer": 4}}]
QUESTIONS = [("what is 1 plus 2 ?", "3"), ("what is 4 plus 4 ?", "8"),
             ("what is 2 plus 5 ?", "7"), ("what is 3 plus 3 ?", "6"),
             ("what is 0 plus 4 ?", ""), ("what is 5 plus 4 ?", "9")]
"""Six prompts, all used in 2 steps of three; the empty answer is an invalid math reference."""


def dataset(chat: bool) -> Dataset:
    prompts = [[{"role": "user", "content": q}] if chat else q for q, _ in QUESTIONS]
    return Dataset.from_dict({"prompt": prompts, "answer": [a for _, a in QUESTIONS]})


def record(trainer: Any, log: dict[str, Any]) -> None:
    """Wrap three steps of the trainer instance to record their inputs and outputs."""
    calculate, generate = trainer._calculate_rewards, trainer._generate_and_score_completions
    compute = trainer._compute_loss

    def calculate_rewards(inputs, prompts, completions, completion_ids_list):
        rewards = calculate(inputs, prompts, completions, completion_ids_list)
        log["batches"].append({
            "prompts": prompts, "completions": completions,
            "completion_ids": [[int(t) for t in ids] for ids in completion_ids_list],
            "answers": [row["answer"] for row in inputs],
            "runs": [len(run) for run in runs_of_equal(prompts)],
            "rewards": rewards.tolist()})
        return rewards

    def generate_and_score(inputs):
        output = generate(inputs)
        for key in ("advantages", "prompt_ids", "completion_ids"):  # padded rows, in order
            log["batches"][-1][f"output_{key}"] = output[key].tolist()
        return output

    def compute_loss(model, inputs):
        log["loss_inputs"].append({key: inputs[key].tolist() for key in
                                   ("prompt_ids", "completion_ids", "advantages")})
        return compute(model, inputs)

    trainer._calculate_rewards = calculate_rewards
    trainer._generate_and_score_completions = generate_and_score
    trainer._compute_loss = compute_loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--mode", required=True, choices=["trl", "tempo"])
    parser.add_argument("--estimator", default="tempo", help="for --mode tempo")
    parser.add_argument("--no-validate", action="store_true",
                        help="skip the build-time catalogue check, so that an unknown "
                        "--estimator is refused by the server during training")
    args = parser.parse_args()
    url = args.url

    if args.mode == "trl":
        reward_funcs = reward_functions(url, REWARDS)
        weights = [f.weight for f in reward_funcs]
    else:
        reward_funcs = [async_reward_function(url, REWARDS)]
        weights = None
    config = GRPOConfig(output_dir=str(args.out / "trainer"), per_device_train_batch_size=6,
                        num_generations=4, max_completion_length=8, max_steps=2, beta=0.0,
                        learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True,
                        save_strategy="no", seed=7, reward_weights=weights,
                        ddp_backend="gloo", dataloader_num_workers=0)
    trainer = GRPOTrainer(model=args.model, processing_class=load_tokenizer(args.model),
                          reward_funcs=reward_funcs, args=config,
                          train_dataset=dataset(chat=args.mode == "tempo"))
    if args.mode == "tempo":
        rewardd_advantages(trainer, url, {"estimator": args.estimator, "params": {"beta": 1.0}},
                           validate=not args.no_validate)
    log: dict[str, Any] = {"batches": [], "loss_inputs": []}
    record(trainer, log)
    rank = int(os.environ.get("RANK", "0"))
    try:
        trainer.train()
    except Exception as exc:  # recorded per process: each must raise, none may wait forever
        (args.out / f"rank{rank}.error").write_text(f"{type(exc).__name__}: {exc}")
        raise
    log["log_history"] = trainer.state.log_history
    log["world_size"] = trainer.accelerator.num_processes
    (args.out / f"rank{rank}.json").write_text(json.dumps(log))
    close_process_group()


def close_process_group() -> None:
    """Tear gloo down before the interpreter does: left to interpreter exit, its C++ threads are
    sometimes destroyed while joinable and the process aborts ("terminate called without an active
    exception", SIGABRT) after training has succeeded, which fails the torchrun launch."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
