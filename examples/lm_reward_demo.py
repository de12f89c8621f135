"""Fine-tune a language model by ES on a reward, offline, end to end, in minutes on a CPU.

1. Train a character tokenizer locally (the ``tokenizers`` library) on a synthetic corpus of arithmetic
   problems with their answers ("37+45=82").
2. Pretrain a small Llama-style model on that corpus by next-token prediction for a short while, so that
   it knows the format but answers many problems wrong (imperfect on purpose), and save it as a Hugging Face
   directory (``save_pretrained``).
3. Fine-tune it by ES on the exact-answer reward: ``nesgpu train --task arithmetic --model hf:DIR``. The
   held-out accuracy (greedy) is the run's metric; the fine-tuned model is saved in ``RUN/hf``.

    python examples/lm_reward_demo.py --out runs/lm-demo            # pretrain, then ES (a few minutes)
    python examples/lm_reward_demo.py --out runs/lm-demo --es-steps 0   # only the pretrained model
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch


def train_tokenizer(corpus: list[str]):
    """A character-level tokenizer trained on ``corpus`` (WordLevel over single characters)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[EOS]", "[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", eos_token="[EOS]",
                                   unk_token="[UNK]")


def pretrain(tokenizer, corpus: list[str], steps: int, seed: int):
    """A small Llama trained on ``corpus`` by AdamW for ``steps`` steps of 64 lines."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        lines = [corpus[i] for i in torch.randint(len(corpus), (64,), generator=gen).tolist()]
        batch = tokenizer(lines, return_tensors="pt", padding=True)
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/lm-demo", help="the demo's directory (model/, es/)")
    parser.add_argument("--pretrain-steps", type=int, default=150)
    parser.add_argument("--es-steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--es-args", default="", help="more nesgpu train options, e.g. '--population 64'")
    args = parser.parse_args()
    from nesgpu.tasks.verifiers import arithmetic_problems

    out = Path(args.out)
    corpus = [f"{prompt}{answer}\n" for prompt, answer in arithmetic_problems(4000, seed=0)]  # the train split
    tokenizer = train_tokenizer(corpus)
    start = time.perf_counter()
    model = pretrain(tokenizer, corpus, args.pretrain_steps, args.seed)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    print(f"pretrained {args.pretrain_steps} steps in {time.perf_counter() - start:.0f} s -> {out / 'model'}",
          file=sys.stderr)
    command = [sys.executable, "-m", "nesgpu", "train", "--task", "arithmetic", "--model", f"hf:{out / 'model'}",
               "--steps", str(max(args.es_steps, 1)), "--seed", str(args.seed), "--out", str(out / "es"),
               "--overwrite", "--log", "none", *args.es_args.split()]
    if args.es_steps == 0:
        command += ["--lr", "1e-12"]  # one step that changes nothing: the pretrained model's accuracy
    print(" ".join(command), file=sys.stderr)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        print(result.stderr, file=sys.stderr)
        return result.returncode
    rows = [line for line in (out / "es" / "metrics.csv").read_text().splitlines()]
    header = rows[0].split(",")
    at = header.index("accuracy")
    curve = [(r.split(",")[0], r.split(",")[at]) for r in rows[1:] if r.split(",")[at]]
    print(json.dumps({"held_out_accuracy_by_step": curve, "summary": json.loads(result.stdout)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
