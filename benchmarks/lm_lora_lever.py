"""A lever of benchmarks/lm_levers.py run from Python: ES on LoRA adapters only (PEFT), so that far fewer
parameters evolve (4k at rank 2 on every projection of the race's 76k-parameter Llama), on the race's work and
budget (benchmarks/lm_vs_grpo.py), scored by the race's one function on the validation split (the adapters
merged into a fresh copy). One run per call; run two at a time, one thread each, as lm_levers.py does.

    python benchmarks/lm_lora_lever.py --out runs/race --model demo --rank 2 --sigma 0.02 --lr 1e-3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_vs_grpo import MODELS, REWARD, score  # noqa: E402  (this folder's)

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main() -> None:
    import peft

    import nesgpu
    from nesgpu.tasks import make_task
    from nesgpu.train import TrainConfig, train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/race"), help="the race's folder (prepared by it)")
    parser.add_argument("--model", default="demo", choices=list(MODELS))
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--sigma", type=float, default=0.02)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seconds", type=float, default=120)
    args = parser.parse_args()
    race = args.out.resolve()
    directory, run = race / args.model / "model", race / args.model / "lora" / f"r{args.rank}-s{args.sigma}-lr{args.lr}"
    task = make_task("generation", model=f"hf:{directory}", prompts=str(race / "train.jsonl"),
                     eval_prompts=str(race / "val.jsonl"), reward=REWARD, correct_at=1.0, max_new_tokens=6)
    config = peft.LoraConfig(r=args.rank, lora_alpha=args.rank, target_modules=PROJECTIONS, lora_dropout=0.0)
    lora = peft.get_peft_model(task.make_model((), f"hf:{directory}"), config)
    evolved = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    summary = train(TrainConfig(task="generation", population=32, sigma=args.sigma, lr=args.lr, steps=1_000_000,
                                time_budget=args.seconds, eval_seconds=20, out=str(run), log="none"),
                    model=lora, task=task, overwrite=True)
    nesgpu.export(lora).merge_and_unload().save_pretrained(run / "merged")
    task.tokenizer.save_pretrained(run / "merged")
    print(json.dumps({"model": args.model, "rank": args.rank, "sigma": args.sigma, "lr": args.lr,
                      "evolved": evolved, "steps": summary["steps"],
                      "score": score(str(run / "merged"), race / "val.jsonl")}))


if __name__ == "__main__":
    main()
