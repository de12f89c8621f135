"""The workers of lm_memory.py: what each of its fresh, measured processes runs.

The model shapes and the run constants, the prompts and reward file, and one worker per method (``create``,
``inference``, ``grpo``, ``grpo_lora``). Only the standard library is imported at the top, so that both
environments (the project's and TRL's) run it alike:

    python benchmarks/lm_memory_workers.py --worker inference --model runs/mem/models/qwen2-0.5B --reward R
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

# the shapes of the released Qwen2 / Qwen2.5 checkpoints (config.json); random weights
SIZES = {
    "0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "3B": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
               intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True),
    "7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=151936, tie_word_embeddings=False),
}
ROWS, NEW_TOKENS, STEPS = 16, 8, 2  # inference: rows per generate(); every method: new tokens, steps
PROMPTS_PER_STEP, GENERATIONS = 2, 4  # GRPO: 2 prompts x 4 completions
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

REWARD = '''"""The benchmark's reward (TRL's signature): 1 for the sum of "a+b=" on the completion's first line, 0.1 for
another integer, else 0; plus a tie-breaker under 0.001 from the completion's characters, so that members whose
completions differ at all score apart (a random model answers no sum: without it every step would carry no
signal, and nesgpu skips the optimizer step of such a step, never allocating Adam's moments). Self-contained,
so every environment imports it alike."""


def correct(completions, prompts=None, **columns):
    rewards = []
    for prompt, completion in zip(prompts, completions):
        a, b = prompt.rstrip("=").split("+")
        answer = completion.split("\\n", 1)[0].strip()
        score = 1.0 if answer == str(int(a) + int(b)) else 0.1 if answer.lstrip("-").isdigit() else 0.0
        rewards.append(score + 1e-3 * (sum(ord(c) * (i + 1) for i, c in enumerate(completion)) % 997) / 997)
    return rewards
'''


# ----------------------------------------------------------------------------------------------- the data
def prompt_rows() -> list[dict]:
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]


def write_data(root: Path) -> dict:
    """The prompts (JSON lines), the held-out prompts and the reward file under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    rows = prompt_rows()
    paths = {"prompts": root / "train.jsonl", "eval_prompts": root / "eval.jsonl", "reward": root / "reward.py"}
    paths["prompts"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["eval_prompts"].write_text("".join(json.dumps(r) + "\n" for r in rows[::50]))  # 2 rows
    paths["reward"].write_text(REWARD)
    return {k: str(v) for k, v in paths.items()}


# --------------------------------------------------------------------------------- workers (fresh processes)
def load_reward(path: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.correct


def worker_create(args) -> dict:
    """A Qwen2 of the size's shape with random weights (normal, std 0.02; norms 1, biases 0), built in
    bfloat16 on the CPU without a float32 copy, saved with safetensors in 2 GB shards; and a tokenizer: a
    character-level WordLevel one over the whole vocabulary (digits and operators, then filler tokens), so
    that every id a random model generates decodes."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    shape = SIZES[args.size]
    out = Path(args.model)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    specials, chars = ["<pad>", "<|endoftext|>"], list("0123456789+-*/=() \n")
    vocab = specials + chars
    vocab += [f"<t{i}>" for i in range(shape["vocab_size"] - len(vocab))]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<pad>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Split("", "isolated"), decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|endoftext|>").save_pretrained(tmp)

    config = Qwen2Config(**shape, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, use_sliding_window=False,
                         pad_token_id=0, eos_token_id=1, bos_token_id=None, dtype="bfloat16")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model.to_empty(device="cpu")
    if shape["tie_word_embeddings"]:
        model.tie_weights()
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied: listed once
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(tmp, max_shard_size="2GB")
    del model
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return {"params": params}


def worker_inference(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval()
    batch = tok([r["prompt"] for r in prompt_rows()[:ROWS]], return_tensors="pt", padding=True)
    for _ in range(STEPS):
        out = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
    return {"params": sum(p.numel() for p in model.parameters()), "output_shape": list(out.shape)}


def worker_grpo(args, lora: bool) -> dict:
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    peft_config = None
    if lora:
        import peft
        peft_config = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS,
                                      task_type="CAUSAL_LM")
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, use_cpu=True, seed=0, learning_rate=1e-4,
                            per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS,
                            num_generations=GENERATIONS, max_completion_length=NEW_TOKENS, beta=0.0,
                            max_steps=STEPS, logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True)
        trainer = GRPOTrainer(model=model, reward_funcs=[load_reward(args.reward)], args=config,
                              train_dataset=Dataset.from_list(prompt_rows()), processing_class=tok,
                              peft_config=peft_config)
        result = trainer.train()
    trained = trainer.model
    return {"params": sum(p.numel() for p in trained.parameters()),
            "trainable": sum(p.numel() for p in trained.parameters() if p.requires_grad),
            "steps": result.global_step, "bf16_flag": config.bf16,
            "param_dtypes": sorted({str(p.dtype) for p in trained.parameters()})}


WORKERS = {"create": worker_create, "inference": worker_inference,
           "grpo": lambda a: worker_grpo(a, lora=False), "grpo_lora": lambda a: worker_grpo(a, lora=True)}


def run_worker(args) -> None:
    import importlib.metadata as md
    start = time.perf_counter()
    result = WORKERS[args.worker](args)
    result["versions"] = {}
    for package in ("torch", "transformers", "trl", "peft", "tokenizers"):
        try:
            result["versions"][package] = md.version(package)
        except md.PackageNotFoundError:
            pass
    result["worker_seconds"] = round(time.perf_counter() - start, 1)
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", required=True, choices=sorted(WORKERS), help="the method to run")
    parser.add_argument("--size", choices=list(SIZES), help="create: the model's shape")
    parser.add_argument("--model", required=True, help="the model directory (create: written)")
    parser.add_argument("--reward", help="grpo, grpo_lora: the reward file (write_data's)")
    run_worker(parser.parse_args())


if __name__ == "__main__":
    main()
