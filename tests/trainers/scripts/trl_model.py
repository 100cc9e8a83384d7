"""Build the tiny random Qwen2 and its word-level tokenizer that the TRL tests train, offline.

    python tests/trainers/scripts/trl_model.py OUT_DIR

Nothing is downloaded: the tokenizer's vocabulary is the few words the prompts use, digits and
the chat roles; the weights come from a fixed seed. The vocabulary is tiny on purpose: sampled
completions of one prompt then share prefixes and branch, which is what a prefix-tree
estimator (tempo) needs to give tokens of one completion different advantages. A wide
initialisation (``initializer_range``) makes the random model's next-token distributions
peaked, so shared prefixes are common rather than rare; the end-of-sequence logit is raised
so that completions end at different lengths.
"""

from __future__ import annotations

import sys
from pathlib import Path

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
WORDS = ["what", "is", "plus", "?", "user", "assistant", "system", ":", "the", "answer",
         *[str(d) for d in range(10)]]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} : {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)
SEED = 11
EOS_LOGIT = 4.0


def build(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (GenerationConfig, PreTrainedTokenizerFast, Qwen2Config,
                              Qwen2ForCausalLM)

    vocab = {token: i for i, token in enumerate([PAD, EOS, UNK, *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(cleanup=False)  # words joined by spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS,
                                        unk_token=UNK)
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(SEED)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=128, initializer_range=0.5,
                         tie_word_embeddings=False, bos_token_id=None,
                         eos_token_id=vocab[EOS], pad_token_id=vocab[PAD])
    model = Qwen2ForCausalLM(config).eval()
    # A random model almost never samples EOS; give its output row the mean direction of the
    # final hidden states, scaled to a logit of about EOS_LOGIT, so completions end at varied
    # lengths (length rewards differ, loss masks have zeros).
    prompt = tokenizer(["what is 1 plus 2 ?", "what is 3 plus 4 ?"], return_tensors="pt")
    with torch.no_grad():
        sampled = model.generate(**prompt, do_sample=True, max_new_tokens=8,
                                 num_return_sequences=8, eos_token_id=vocab[EOS],
                                 pad_token_id=vocab[PAD])
        hidden = model(sampled, output_hidden_states=True).hidden_states[-1]
        direction = hidden.reshape(-1, hidden.shape[-1]).mean(0)
        model.lm_head.weight[vocab[EOS]] = direction * EOS_LOGIT / direction.dot(direction)
    model.generation_config = GenerationConfig(eos_token_id=vocab[EOS], pad_token_id=vocab[PAD])
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load_tokenizer(path: str | Path):
    """The tokenizer as saved (AutoTokenizer would rebuild Qwen2's byte-level BPE from the
    vocabulary, since the model is a Qwen2)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(path)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
