"""Fine-tune a language model by ES on a reward, offline, end to end, in minutes on a CPU.

1. Write a pretraining corpus of arithmetic problems with their answers ("37+45=82"): every problem of the
   task's space except the held-out ones, answered by a teacher that makes one systematic mistake on
   purpose: in half of the lines the answer's last digit is one too high ("37+45=83").
2. Train a character tokenizer locally (the ``tokenizers`` library), pretrain a small Llama-style model on
   the corpus by next-token prediction (the answers only), and save both as a Hugging Face directory
   (``save_pretrained``). The model learns the arithmetic and the teacher's mistake with it: its greedy
   answers are right about half the time.
3. Fine-tune it by ES on the exact-answer reward: ``nesgpu train --task arithmetic --model hf:DIR``. The
   held-out accuracy (greedy) is the run's metric; the fine-tuned model is saved in ``RUN/hf``.

    python examples/lm_reward_demo.py --out runs/lm-demo                 # pretrain, then ES
    python examples/lm_reward_demo.py --out runs/lm-demo --pretrained runs/lm-demo/model   # ES again
"""

from __future__ import annotations

import argparse
import csv
import json
import random
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


def llama_config(tokenizer, hidden: int = 64, layers: int = 2):
    """A small Llama-style config for ``tokenizer``: ``layers`` blocks of width ``hidden``, grouped-query
    attention, a context of 64 tokens."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)


def corpus(teacher_error: float, seed: int, flaw: str = "last", exclude=()) -> list[str]:
    """Lines "PROMPT ANSWER\n" for every distinct arithmetic problem but the task's held-out ones (and the
    prompts in ``exclude``); with probability ``teacher_error`` the teacher is wrong by one in the answer's
    ``flaw`` digit, "last" or "first" (one too high, 9 becomes 0)."""
    from nesgpu.tasks.reward_tasks import splits
    from nesgpu.tasks.verifiers import arithmetic_problems

    if flaw not in ("last", "first"):
        raise ValueError(f"flaw must be 'last' or 'first'; got {flaw!r}")
    held_out = set(splits(arithmetic_problems)[1]) | set(exclude)
    problems = [p for p in dict.fromkeys(arithmetic_problems(60_000, seed=7)) if p[0] not in held_out]
    rng = random.Random(seed)

    def teacher(answer: str) -> str:
        if rng.random() >= teacher_error:
            return answer
        at = len(answer) - 1 if flaw == "last" else int(answer.startswith("-"))
        return answer[:at] + str((int(answer[at]) + 1) % 10) + answer[at + 1:]
    return [f"{prompt}{teacher(answer)}\n" for prompt, answer in problems]


def pretrain(tokenizer, lines: list[str], steps: int, seed: int, batch: int = 128):
    """A small Llama trained on ``lines`` by AdamW (one-cycle schedule) for ``steps`` steps of ``batch``
    lines, the loss on the answers only (what follows "=")."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 3e-3, total_steps=steps, pct_start=max(0.05, 2 / steps))
    gen, equals = torch.Generator().manual_seed(seed), tokenizer.convert_tokens_to_ids("=")
    start = shown = time.perf_counter()
    for step in range(1, steps + 1):
        text = [lines[i] for i in torch.randint(len(lines), (batch,), generator=gen).tolist()]
        enc = tokenizer(text, return_tensors="pt", padding=True)
        answer = (enc.input_ids == equals).int().cumsum(1) > 0
        labels = enc.input_ids.masked_fill((enc.attention_mask == 0) | ~answer, -100)
        loss = model(**enc, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if time.perf_counter() - shown >= 10 or step in (1, steps):  # progress, every 10 s
            shown, elapsed = time.perf_counter(), time.perf_counter() - start
            print(f"pretraining: step {step}/{steps}, loss {loss.item():.3f}, {elapsed:.0f} s, about "
                  f"{elapsed / step * (steps - step):.0f} s to go", file=sys.stderr, flush=True)
    return model.eval()


def held_out_accuracy(directory: Path) -> float:
    """The greedy held-out accuracy of the model in ``directory`` on the arithmetic task."""
    from nesgpu.tasks import make_task

    task = make_task("arithmetic", model=f"hf:{directory}")
    return task.evaluate(task.make_model((), f"hf:{directory}"))


def fine_tune(directory: Path, out: Path, seconds: float, seed: int, extra: list[str]) -> dict:
    """``nesgpu train --task arithmetic --model hf:DIR`` for ``seconds``; its summary and accuracy curve."""
    command = [sys.executable, "-m", "nesgpu", "train", "--task", "arithmetic", "--model", f"hf:{directory}",
               "--time-budget", str(seconds), "--seed", str(seed), "--out", str(out), "--overwrite",
               "--log", "none", *extra]
    print(" ".join(command), file=sys.stderr)
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if result.returncode:
        raise SystemExit(result.returncode)
    with open(out / "metrics.csv", newline="") as f:
        curve = [(int(r["step"]), round(float(r["seconds"])), float(r["accuracy"]))
                 for r in csv.DictReader(f) if r["accuracy"]]
    return {"curve": curve, "summary": json.loads(result.stdout)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/lm-demo", help="the demo's directory (model/, es/)")
    parser.add_argument("--pretrained", help="skip pretraining: fine-tune this Hugging Face directory")
    parser.add_argument("--pretrain-steps", type=int, default=1500)
    parser.add_argument("--teacher-error", type=float, default=0.5, help="the corpus's share of wrong answers")
    parser.add_argument("--es-seconds", type=float, default=300, help="ES's wall-clock budget (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--es-args", default="", help="more nesgpu train options, e.g. '--population 64'")
    args = parser.parse_args()
    out = Path(args.out)
    directory = Path(args.pretrained) if args.pretrained else out / "model"
    if not args.pretrained:
        lines = corpus(args.teacher_error, args.seed)
        tokenizer = train_tokenizer(lines)
        start = time.perf_counter()
        model = pretrain(tokenizer, lines, args.pretrain_steps, args.seed)
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        print(f"pretrained {args.pretrain_steps} steps on {len(lines)} lines in {time.perf_counter() - start:.0f} s "
              f"-> {directory}", file=sys.stderr)
    before = held_out_accuracy(directory)
    print(f"held-out accuracy of the pretrained model: {before:.1%}", file=sys.stderr)
    if not args.es_seconds:
        return 0
    result = fine_tune(directory, out / "es", args.es_seconds, args.seed, args.es_args.split())
    after = result["curve"][-1][2]
    print(json.dumps({"pretrained_accuracy": before, "fine_tuned_accuracy": after,
                      "held_out_accuracy_by_step_and_second": result["curve"], "summary": result["summary"]}, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:  # a bad --pretrained directory, say: one line, not a traceback
        sys.exit(f"lm_reward_demo: error: {e}")
