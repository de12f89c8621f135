"""GenerationTask: a causal LM's population scored on a reward, with a tiny Llama (random init from a
config) and a character tokenizer built locally with `tokenizers` (no hub)."""

import csv
import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from conftest import CHARS, char_tokenizer
from safetensors.torch import load_file

import nesgpu
from nesgpu.noise import BLOCK
from nesgpu.population import Population
from nesgpu.tasks.generation import GenerationTask
from nesgpu.tasks.verifiers import arithmetic_problems, arithmetic_reward, rewards_of
from nesgpu.train import TrainConfig, train

tf = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

def tiny_llama(seed=0, context=64):
    torch.manual_seed(seed)
    config = tf.LlamaConfig(vocab_size=len(CHARS) + 3, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                            pad_token_id=0, bos_token_id=1, eos_token_id=1)
    return tf.LlamaForCausalLM(config).eval()


def digit_count(prompts, completions):
    """A hand-checkable reward: how many digits the completion has."""
    return torch.tensor([float(sum(ch.isdigit() for ch in c)) for c in completions])


PROMPTS = [p for p, _ in arithmetic_problems(12, seed=0)]


def task(**kw):
    options = dict(prompts=PROMPTS, tokenizer=char_tokenizer(), reward=digit_count, max_new_tokens=5,
                   prompts_per_step=3, shaping="none", correct_at=None, name="digits-count")
    options.update(kw)
    return GenerationTask(**options)


def population(chunk=None, directions=4):
    net = nesgpu.convert(tiny_llama(), "lowrank")
    pm = nesgpu.PerturbedModel(net, directions, sigma=0.5, antithetic=True, seed=1)
    return Population(pm, chunk=chunk, log=lambda *a: None)


def test_fitness_is_each_rows_reward_in_the_member_layout():
    t, pop = task(), population()
    result = pop.evaluate(t, 1, 0.5)
    assert result.fitness.shape == (2 * 3, 4)  # (signs * prompts, directions)
    pm, prompts = pop.pm, t.step_prompts(1)
    pm.set_noise(step=1)
    ids, mask = t.encode_prompts(prompts, pm.model)
    with pm.perturbing():
        out = pm.model.generate(input_ids=pm.member_rows(ids), attention_mask=pm.member_rows(mask), max_new_tokens=5,
                                do_sample=False, pad_token_id=0)
    texts = [s.split("\n")[0] for s in t.tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)]
    for n, text in enumerate(texts):  # row n: sign n // 12, prompt (n // 4) % 3, direction n % 4
        sign, prompt, d = n // 12, (n // 4) % 3, n % 4
        assert result.fitness[sign * 3 + prompt, d] == sum(ch.isdigit() for ch in text)
    assert len(set(texts)) > 1  # the members answer differently


def test_chunked_equals_unchunked():
    a = population(None).evaluate(task(), 2, 0.5)
    b = population(1).evaluate(task(), 2, 0.5)
    assert torch.equal(a.fitness, b.fitness)


def test_activation_bytes_count_the_kv_cache_of_every_row_of_a_direction():
    t, pop = task(), population(directions=4)
    config = pop.pm.model.config
    longest = max(len(char_tokenizer()(p).input_ids) for p in PROMPTS)
    tokens = longest + t.max_new_tokens
    cache = 2 * config.num_hidden_layers * config.num_key_value_heads * (32 // 4) * tokens * 4
    layer = tokens * (4 * 32 + 2 * 48) * 4
    assert t.activation_bytes(pop.pm) == 2 * t.prompts_per_step * (cache + layer + 2 * config.vocab_size * 4)


def test_auto_chunk_counts_the_tasks_activations_and_matches_unchunked(monkeypatch):
    """With chunk "auto", a memory where the noise of every direction fits but their KV caches do not gives
    blocks that fit both; the fitness is the unchunked one."""
    t, whole = task(), population(directions=8)
    expected = whole.evaluate(t, step=1, sigma=0.5).fitness
    shared, noise = population(directions=8).blocks.noise_bytes_per_direction()
    per = noise + t.activation_bytes(whole.pm)
    free = 2 * (shared + BLOCK * noise + 3 * per)  # half of it: blocks of 3 directions (and a drawn block)
    monkeypatch.setenv("NESGPU_FREE_MEMORY", str(free))
    logs = []
    pm = nesgpu.PerturbedModel(nesgpu.convert(tiny_llama(), "lowrank"), 8, sigma=0.5, antithetic=True, seed=1)
    auto = Population(pm, chunk="auto", log=logs.append)
    assert auto.chunk == 8  # the noise alone fits whole
    fitness = auto.evaluate(t, step=1, sigma=0.5).fitness
    assert auto.chunk == 3 and "KV cache" in logs[-1]
    torch.testing.assert_close(fitness, expected)


def test_per_prompt_shaping_standardises_each_prompt_over_all_members():
    t = task(shaping="per_prompt")
    raw = torch.tensor([[1.0, 2.0], [5.0, 5.0], [0.0, 4.0],  # + sign: prompts 0, 1, 2
                        [3.0, 2.0], [5.0, 5.0], [4.0, 0.0]])  # - sign
    shaped = t.shape(raw).view(2, 3, 2)
    for prompt in (0, 2):
        values = shaped[:, prompt].reshape(-1)
        assert abs(float(values.mean())) < 1e-6 and abs(float(values.std(unbiased=False)) - 1) < 1e-6
    assert torch.equal(shaped[:, 1], torch.zeros(2, 2))  # every member alike: no signal
    expected = (torch.tensor([1.0, 2.0, 3.0, 2.0]) - 2.0) / torch.tensor([1.0, 2.0, 3.0, 2.0]).std(unbiased=False)
    torch.testing.assert_close(shaped[:, 0].reshape(-1), expected)


def test_evaluate_is_greedy_on_the_held_out_prompts_and_keeps_samples():
    t = task(reward=rewards_of(arithmetic_reward), correct_at=1.0, eval_prompts=PROMPTS[:5])
    model = tiny_llama()
    value = t.evaluate(model)
    assert t.metric == "accuracy" and 0.0 <= value <= 1.0 and len(t.samples) == 5
    assert value == sum(s["reward"] >= 1.0 for s in t.samples) / 5
    assert t.evaluate(model) == value  # greedy: the same answers again


def test_train_and_resume_a_language_model_on_a_reward(tmp_path):
    cfg = TrainConfig(steps=4, population=8, sigma=0.5, lr=0.01, eval_every=2, checkpoint_every=2, log="none",
                      out=str(tmp_path / "straight"))
    summary = train(cfg, model=tiny_llama(), task=task(), log=lambda *a, **k: None)
    assert summary["task"] == "custom:digits-count" and summary["metric"] == "mean_reward"
    train(dataclasses.replace(cfg, steps=2, out=str(tmp_path / "split")), model=tiny_llama(), task=task(),
          log=lambda *a, **k: None)
    train(dataclasses.replace(cfg, out=str(tmp_path / "split")), model=tiny_llama(seed=9), task=task(), resume=True,
          log=lambda *a, **k: None)
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("straight", "split"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    import json  # what the model said at each evaluation (steps 2 and 4; 12 held-out prompts each)

    samples = [[json.loads(line) for line in (tmp_path / d / "samples.jsonl").read_text().splitlines()]
               for d in ("straight", "split")]
    assert samples[0] == samples[1] and [s["step"] for s in samples[0]] == [0] * 12 + [2] * 12 + [4] * 12
    assert set(samples[0][0]) == {"step", "prompt", "completion", "reward"}


@pytest.mark.parametrize("reward, error, match", [
    (lambda p, c: 1 / 0, ValueError, "the reward function test_generation:<lambda> raised ZeroDivisionError"),
    (lambda p, c: torch.full((len(c),), float("nan")), ValueError, "non-finite reward"),
    (lambda p, c: torch.zeros(len(c) + 1), ValueError, r"must return shape \(24,\)"),
    (lambda p, c: [0.0] * len(c), TypeError, "must return a torch.Tensor of 24 floats; got list"),
])
def test_a_bad_reward_function_is_named(reward, error, match):
    with pytest.raises(error, match=match):
        population().evaluate(task(reward=reward), 1, 0.5)


def test_bad_inputs_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match="prompts must be a non-empty list of strings"):
        task(prompts=[])
    with pytest.raises(ValueError, match="prompts must be a non-empty list of strings"):
        task(prompts="12+3=")
    with pytest.raises(ValueError, match="the tokenizer has no pad token"):
        task(tokenizer=char_tokenizer(pad=False))
    with pytest.raises(TypeError, match="reward must be a function"):
        task(reward=1.0)
    with pytest.raises(ValueError, match="shaping must be one of"):
        task(shaping="ranks")
    with pytest.raises(TypeError, match="temperature must be a number \\(0: greedy\\); got str '1'"):
        task(temperature="1")
    long = task(prompts=["1" * 62], max_new_tokens=5)
    with pytest.raises(ValueError, match="exceed the model's context of 64 tokens"):
        long.evaluate(tiny_llama())


def saved_model(directory):
    model, tokenizer = tiny_llama(), char_tokenizer()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_countdown_from_a_local_directory_saves_a_model_transformers_loads(tmp_path):
    hf = saved_model(tmp_path / "tiny")
    out = tmp_path / "run"
    summary = train(TrainConfig.flat(task="countdown", model=f"hf:{hf}", steps=2, population=4, batch_size=2,
                                eval_every=2, log="none", out=str(out)), log=lambda *a, **k: None)
    assert summary["task"] == "countdown" and summary["metric"] == "accuracy"
    back = tf.AutoModelForCausalLM.from_pretrained(out / "hf", local_files_only=True)
    trained = load_file(out / "model.safetensors")
    assert all(torch.equal(back.state_dict()[k], v) for k, v in trained.items())
    # sigma auto: the probe finds a sigma at which the random model's members score differently, and it trains
    assert summary["sigma_probe"]["sigma"] == summary["sigma"] and summary["steps_without_signal"] < 1
    assert not all(torch.equal(tiny_llama().state_dict()[k], v) for k, v in trained.items())  # it trained
    model, task, cfg = nesgpu.load_run(out)
    assert task.evaluate(model) == summary["value"]


def test_a_model_loaded_in_bfloat16_trains_with_float32_masters_and_saves_in_bfloat16(tmp_path):
    hf = saved_model(tmp_path / "tiny")
    out = tmp_path / "run"
    train(TrainConfig.flat(task="arithmetic", model=f"hf:{hf}", dtype="bfloat16", steps=2, population=4, batch_size=2,
                      eval_every=2, log="none", out=str(out)), log=lambda *a, **k: None)
    back = tf.AutoModelForCausalLM.from_pretrained(out / "hf", local_files_only=True)
    assert back.dtype == torch.bfloat16
    trained = load_file(out / "model.safetensors")
    assert all(v.dtype == torch.bfloat16 for v in trained.values())
    assert all(torch.equal(back.state_dict()[k], v) for k, v in trained.items())


def test_a_missing_or_foreign_directory_is_one_line(tmp_path):
    from nesgpu.cli import main

    (tmp_path / "empty").mkdir()
    for model, match in ((f"hf:{tmp_path / 'nope'}", "is not a Hugging Face model directory"),
                         (f"hf:{tmp_path / 'empty'}", "is not a Hugging Face model directory"),
                         ("mlp", "needs --model hf:DIR")):
        with pytest.raises(SystemExit) as e:
            main(["train", "--task", "countdown", "--model", model, "--steps", "1", "--out", str(tmp_path / "r")])
        assert e.value.code != 0


@pytest.mark.parametrize("fitness", [[], ["--fitness", "likelihood", "--temperature", "1", "--generations", "3"]],
                         ids=["reward", "likelihood"])
def test_torchrun_two_processes_bit_identical_to_one(tmp_path, fitness):
    """A generation task under torchrun: the ranks split the members, per-prompt shaping runs on the
    gathered rewards, and the weights and samples are one process's with the same blocks (with the likelihood
    fitness, every rank draws the step's completions alike)."""
    hf = saved_model(tmp_path / "tiny")
    args = ["train", "--task", "arithmetic", "--model", f"hf:{hf}", "--population", "8", "--steps", "2",
            "--batch-size", "2", "--eval-every", "2", "--eval-generations", "2", "--kl", "--device", "cpu", *fitness]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                          "nesgpu", *args, "--out", str(tmp_path / "two")], capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "nesgpu", *args, "--chunk-size", "2", "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "two" / "samples.jsonl").read_text() == (tmp_path / "one" / "samples.jsonl").read_text()
    # the step's kl (measured by the rank with the first direction) and the evaluation's columns, as one process's
    def metrics(run):
        with open(tmp_path / run / "metrics.csv", newline="") as f:
            return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]
    assert metrics("one") == metrics("two")
    assert metrics("two")[2]["kl"] != "" and metrics("two")[2]["eval_pass@2"] != ""
