"""A tiny Llama for serving tests: built here, since no model can be downloaded.

Two layers, hidden size 128, random weights (seeded), and a byte-level BPE
tokenizer of about 2k tokens trained on generated English-like text, with a
ChatML chat template. It loads in vLLM's CPU build in seconds; what it
generates is noise, which is all a leak gate needs: the cache's bookkeeping
does not depend on what the tokens mean.

Run it with a Python that has ``transformers`` and ``tokenizers`` (the vLLM
venv)::

    python -m kvwatch.targets.vllm.tinymodel DIR

It writes ``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json`` and ``generation_config.json`` into DIR.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

VOCAB = 2048
CONTEXT = 4096
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "on",
    "for",
    "with",
    "from",
    "by",
    "at",
    "as",
    "is",
    "was",
    "are",
    "be",
    "cache",
    "page",
    "pool",
    "tree",
    "node",
    "request",
    "session",
    "turn",
    "token",
    "prefix",
    "agent",
    "tool",
    "call",
    "result",
    "plan",
    "step",
    "file",
    "code",
    "test",
    "search",
    "read",
    "write",
    "run",
    "check",
    "list",
    "open",
    "close",
    "fix",
    "bug",
    "leak",
    "memory",
    "block",
    "slot",
    "state",
    "model",
    "server",
    "client",
    "engine",
    "queue",
    "batch",
    "prompt",
    "reply",
    "user",
    "system",
    "assistant",
    "value",
    "key",
    "table",
    "index",
    "graph",
    "path",
    "time",
    "size",
    "count",
    "free",
    "used",
    "evict",
    "keep",
    "share",
    "hold",
    "drop",
]


def corpus(lines: int, seed: int = 0) -> list[str]:
    """English-like lines over a small vocabulary, with digits and punctuation."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 9999)))
        out.append(" ".join(words).capitalize() + rng.choice(".?!:"))
    return out


def build(where: Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    where.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus(20_000, seed), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML,
        model_max_length=CONTEXT,
    )
    tokenizer.save_pretrained(where)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(where)
    (where / "kvwatch-tiny.json").write_text(json.dumps({"seed": seed, "vocab": len(tokenizer)}))
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(args.out, args.seed))


if __name__ == "__main__":
    main()
