"""Tiny, randomly initialised Hugging Face models built locally, for tests of the model judges.

Nothing is downloaded: the tokenizer is a byte-level BPE trained here on a small built-in
corpus, and the weights come from ``torch.manual_seed``, so two builds give the same files.
The models are real transformers models (Llama architecture), just small enough that a test
file runs in seconds on a CPU: hidden size 64, 2 layers, 4 heads of 16.

``build_tiny_lm(path)`` saves a causal LM (for :mod:`rewardd.verifiers.judge.local`),
``build_tiny_rm(path)`` a one-label sequence-classification model (for
:mod:`rewardd.verifiers.judge.reward_model`). Both return ``path``; tests build each once per module
with ``tmp_path_factory``.
"""

from __future__ import annotations

from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""A minimal chat template in the style of Zephyr: role markers are plain text, every turn
ends with the end-of-sequence token, and the whole conversation starts with BOS."""

CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "What is two plus two? Two plus two is four.",
    "Solve for x: 3x + 5 = 20, so x = 5.",
    "The answer is correct because the derivation checks every step.",
    "<|user|>\nPlease grade the following answer.\n<|assistant|>\nThe grade is 7 out of 10.",
    "<|system|>\nYou are a careful judge of mathematical reasoning.",
    "def add(a, b):\n    return a + b\n",
    "A reward model scores a completion; a judge writes a verdict.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
)
VOCAB_SIZE = 384
SEED = 1234


def _tokenizer():
    """A byte-level BPE tokenizer (any text encodes, decoding is exact) wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    core.train_from_iterator(CORPUS * 4, trainer=trainer)
    bos_id = core.token_to_id(BOS)
    # add_special_tokens=True prepends BOS, like Llama tokenizers do
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A",
                                                        pair=f"{BOS} $A $B",
                                                        special_tokens=[(BOS, bos_id)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS,
                                        pad_token=PAD, unk_token=UNK)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _config(tokenizer, head_dim: int = 16, context: int = 512, **extra):
    """Four heads of 16 by default; two heads of ``head_dim`` otherwise (vLLM's CPU attention
    kernels take head sizes from 32 up, in steps of 16)."""
    from transformers import LlamaConfig

    heads = 4 if head_dim == 16 else 2
    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=heads * head_dim,
                       intermediate_size=2 * heads * head_dim, num_hidden_layers=2,
                       num_attention_heads=heads, num_key_value_heads=heads,
                       head_dim=head_dim, max_position_embeddings=context,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False, **extra)


def build_tiny_lm(path: str | Path, head_dim: int = 16, context: int = 512) -> Path:
    """Save a tiny causal LM with its tokenizer and generation config in ``path``; return it."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    path = Path(path)
    tokenizer = _tokenizer()
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(_config(tokenizer, head_dim, context)).eval()
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_rm(path: str | Path, num_labels: int = 1, head_dim: int = 16,
                  context: int = 512) -> Path:
    """Save a tiny Llama sequence-classification model (``num_labels`` heads, pad token set)
    with its tokenizer in ``path``; return it."""
    import torch
    from transformers import LlamaForSequenceClassification

    path = Path(path)
    tokenizer = _tokenizer()
    torch.manual_seed(SEED + num_labels)
    model = LlamaForSequenceClassification(_config(tokenizer, head_dim, context,
                                                    num_labels=num_labels)).eval()
    with torch.no_grad():
        # the default init (std 0.02) makes every score nearly 0; a wider head makes scores
        # differ clearly between texts, so a test can tell which tokens were scored
        model.score.weight.normal_(0.0, 1.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
