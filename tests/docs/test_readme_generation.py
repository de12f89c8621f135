"""The README's `--task generation` command runs as printed from a clone (issue 55): the prompts files and the
reward function it names ship in examples/prompts, and the command trains (here on a tiny model standing in for
the demo's runs/lm-demo/model, for a step)."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import readme_train_commands

ROOT = Path(__file__).resolve().parents[2]


def generation_command() -> list[str]:
    commands = [shlex.split(c) for c in readme_train_commands() if "--task generation" in c]
    assert len(commands) == 1, commands
    return commands[0]


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_files_the_command_names_ship_with_the_repository():
    from nesgpu.tasks.reward_data import load_function, prompt_rows
    from nesgpu.tasks.reward_tasks import splits
    from nesgpu.tasks.verifiers import arithmetic_problems, arithmetic_reward

    args = generation_command()
    train, test = (prompt_rows(str(ROOT / option(args, name))) for name in ("--prompts", "--eval-prompts"))
    assert len(train) >= 100 and len(test) >= 50
    known, held_out = splits(arithmetic_problems)
    assert {r["prompt"] for r in train} <= set(known) and {r["prompt"] for r in test} <= set(held_out)
    assert all(arithmetic_reward(r["prompt"], r["answer"]) == 1 for r in train + test)  # the answers are right
    path, _, name = option(args, "--reward").rpartition(":")
    correct = load_function(f"{ROOT / path}:{name}")
    assert correct(["44 ", "45"], answer=["44", "44"]) == [1.0, 0.0]
    assert option(args, "--model") == "hf:runs/lm-demo/model"  # examples/lm_reward_demo.py --out runs/lm-demo
    assert "--out runs/lm-demo" in (ROOT / "README.md").read_text()


def test_the_command_runs_from_the_repository_root(tmp_path):
    transformers = pytest.importorskip("transformers")
    from conftest import CHARS, char_tokenizer

    model = tmp_path / "model"
    config = transformers.LlamaConfig(vocab_size=len(CHARS) + 3, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    transformers.LlamaForCausalLM(config).save_pretrained(model)
    char_tokenizer().save_pretrained(model)
    args = generation_command()  # "train", then its options
    args[args.index("--model") + 1] = f"hf:{model}"
    args[args.index("--out") + 1] = str(tmp_path / "run")
    # a sigma given: a random model answers no prompt, so the probe of --sigma auto would refuse it (test_probe.py)
    done = subprocess.run([sys.executable, "-m", "nesgpu", *args, "--steps", "1", "--population", "2",
                           "--batch-size", "2", "--sigma", "0.01", "--log", "none"], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["metric"] == "accuracy"
