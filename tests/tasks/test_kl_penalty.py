"""TRL's KL penalty (``beta``) in a generation task's fitness: each member's reward less beta times its mean k3 KL
from the starting model on its own completions, checked member by member against plain transformers in float64;
nothing changes at beta 0; chunked and resumed runs agree; the option from the CLI, its mistakes in one line."""

import csv
import dataclasses
import subprocess
import sys

import pytest
import torch
from conftest import char_tokenizer
from test_generation import PROMPTS, digit_count, tiny_llama
from test_measures import generation_cli, write_run_files

import nesgpu
from nesgpu.exactness.rows import each_member
from nesgpu.population import Population
from nesgpu.tasks.generation import GenerationTask
from nesgpu.tasks.likelihood import kept_tokens
from nesgpu.train.steps.anchor import StartingWeights

pytest.importorskip("transformers")

QUIET = dict(log=lambda *a, **k: None)


def task(**kw):
    options = dict(prompts=PROMPTS, tokenizer=char_tokenizer(), reward=digit_count, max_new_tokens=5,
                   prompts_per_step=3, shaping="none", correct_at=None, name="digits-count", kl=False)
    return GenerationTask(**{**options, **kw})


def evaluated(t, sigma=0.3, chunk=None, directions=3, step=1):
    """The population's evaluation of ``t`` at ``step`` from a float64 tiny Llama, the starting weights handed over
    as the trainer does; (result, pm, every row's new tokens)."""
    pm = nesgpu.PerturbedModel(nesgpu.convert(tiny_llama().double(), "lowrank"), directions, sigma=sigma,
                               antithetic=True, seed=1)
    population = Population(pm, chunk=chunk, **QUIET)
    t.compare_to(StartingWeights(pm.model, population.parameters()))
    generated = []
    generate = t.generate_tokens

    def recording(*args, **kw):
        generated.append(generate(*args, **kw))
        return generated[-1]
    t.generate_tokens = recording
    return population.evaluate(t, step, sigma), pm, torch.cat([g.cpu() for g in generated])


def own_kl(member, start, tokenizer, prompt, new, kept, temperature):
    """(sum of k3 over the kept tokens, their count) of one completion, each model alone on the unpadded row in
    float64: r = log p_start - log p_member of each token."""
    first = tokenizer(prompt).input_ids
    tokens = torch.tensor([first + new[kept].tolist()])
    logp = [torch.log_softmax(m(input_ids=tokens).logits[0].double() / temperature, -1) for m in (member, start)]
    total = torch.zeros((), dtype=torch.float64)
    for j in range(int(kept.sum())):
        token = tokens[0, len(first) + j]
        r = logp[1][len(first) + j - 1, token] - logp[0][len(first) + j - 1, token]
        total += torch.exp(r) - r - 1
    return total, int(kept.sum())


@pytest.mark.parametrize("temperature, generations", [(0.0, 1), (0.8, 2)], ids=["greedy", "sampled"])
def test_each_members_penalty_is_its_own_mean_k3_from_the_start_in_float64(temperature, generations):
    beta, tokenizer, signs, directions, d = 0.25, char_tokenizer(), 2, 3, 3
    plain, _, _ = evaluated(task(temperature=temperature, generations=generations))
    penalised, pm, new = evaluated(task(temperature=temperature, generations=generations, beta=beta))
    assert torch.equal(penalised.info["reward"], plain.info["reward"])  # the same completions, the raw reward logged
    prompts = task().step_prompts(1)
    kept = kept_tokens(tokenizer, new, ("\n",))
    member, start = tiny_llama().double(), tiny_llama().double()
    pm.set_noise(step=1)
    kl = torch.zeros(signs * len(prompts), directions, dtype=torch.float64)
    with torch.no_grad():
        for s, d in each_member(member, pm):
            for p, prompt in enumerate(prompts):
                rows = [((s * len(prompts) + p) * generations + k) * directions + d for k in range(generations)]
                sums = [own_kl(member, start, tokenizer, prompt, new[n], kept[n], temperature or 1.0) for n in rows]
                count = sum(c for _, c in sums)
                kl[s * len(prompts) + p, d] = sum(t for t, _ in sums) / count if count else 0.0
    assert (kl > 0).any() and penalised.fitness.dtype == torch.float64
    # the members' own models and the population forward, in float64: equal to rounding
    torch.testing.assert_close(penalised.fitness, plain.fitness.double() - beta * kl, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(penalised.info["kl_penalty"], beta * kl.mean(), rtol=1e-9, atol=1e-12)


def test_beta_zero_is_todays_fitness_and_keeps_no_start():
    today, _, _ = evaluated(task())
    zero, _, _ = evaluated(task(beta=0.0))
    assert torch.equal(zero.fitness, today.fitness) and zero.fitness.dtype == today.fitness.dtype
    assert zero.info.keys() == today.info.keys() and "kl_penalty" not in zero.info
    assert not task(beta=0).wants_start and task(beta=0.1).wants_start and task(beta=0, kl=True).wants_start
    assert "kl_penalty" in task(beta=0.1).describes and "kl_penalty" not in task().describes


def test_a_member_at_the_start_has_no_penalty_and_a_perturbed_one_has():
    near, _, _ = evaluated(task(beta=1.0), sigma=1e-9)
    far, _, _ = evaluated(task(beta=1.0), sigma=0.3)
    assert 0 <= float(near.info["kl_penalty"]) < 1e-12 and float(far.info["kl_penalty"]) > 1e-4


@pytest.mark.parametrize("shaping", ["none", "per_prompt"])
def test_chunked_equals_unchunked(shaping):
    whole, _, _ = evaluated(task(beta=0.1, shaping=shaping), directions=4)
    chunked, _, _ = evaluated(task(beta=0.1, shaping=shaping), directions=4, chunk=1)
    torch.testing.assert_close(chunked.fitness, whole.fitness, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(chunked.info["kl_penalty"], whole.info["kl_penalty"], rtol=1e-9, atol=0)


def test_per_prompt_shaping_subtracts_the_penalty_after_standardising_the_rewards():
    """GRPO's advantage less beta x KL: a prompt whose rewards all tie keeps the penalty at its own scale."""
    def reward(prompts, completions):  # every member's reward on PROMPTS[:6] ties
        return torch.tensor([0.5 if p in PROMPTS[:6] else float(sum(ch.isdigit() for ch in c))
                             for p, c in zip(prompts, completions)])

    shaped, _, _ = evaluated(task(beta=0.1, shaping="per_prompt", reward=reward, prompts_per_step=6))
    penalised, _, _ = evaluated(task(beta=0.1, reward=reward, prompts_per_step=6))  # shaping "none": reward - beta KL
    rewards, _, _ = evaluated(task(reward=reward, prompts_per_step=6))
    advantage = task(shaping="per_prompt", reward=reward, prompts_per_step=6).shape(rewards.fitness)
    tied = advantage.eq(0).all(1)
    assert tied.any() and not tied.all()  # a prompt whose rewards all tie: its fitness is the penalty, unscaled
    torch.testing.assert_close(shaped.fitness, advantage + (penalised.fitness - rewards.fitness), rtol=1e-9, atol=1e-9)


def test_the_likelihood_fitness_and_a_bad_beta_are_refused():
    with pytest.raises(ValueError, match="beta 0.1 .* needs fitness 'reward'"):
        task(beta=0.1, fitness="likelihood", temperature=1.0, generations=2)
    for bad in (-1.0, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="beta must be a finite number >= 0"):
            task(beta=bad)
    t = task(beta=0.1)  # outside a trainer, and no starting weights given
    pm = nesgpu.PerturbedModel(nesgpu.convert(tiny_llama(), "lowrank"), 2, sigma=0.1, antithetic=True, seed=1)
    with pytest.raises(ValueError, match="beta 0.1 measures each member's KL from the run's starting weights"):
        Population(pm, **QUIET).evaluate(t, 1, 0.1)


def test_a_resumed_run_equals_a_straight_one(tmp_path):
    from safetensors.torch import load_file

    from nesgpu.train import TrainConfig, train

    cfg = TrainConfig(steps=4, population=6, sigma=0.3, lr=0.05, eval_every=2, checkpoint_every=2, log="none",
                      out=str(tmp_path / "straight"))
    train(cfg, model=tiny_llama(), task=task(beta=0.2, shaping="per_prompt"), **QUIET)
    train(dataclasses.replace(cfg, steps=2, out=str(tmp_path / "split")), model=tiny_llama(),
          task=task(beta=0.2, shaping="per_prompt"), **QUIET)
    train(dataclasses.replace(cfg, out=str(tmp_path / "split")), model=tiny_llama(seed=9),
          task=task(beta=0.2, shaping="per_prompt"), resume=True, **QUIET)
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("straight", "split"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = tiny_llama().state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a if k in start)  # it trained
    state = torch.load(tmp_path / "split" / "checkpoint" / "state.pt", weights_only=True)["strategy"]
    assert "start" in state  # beta keeps the starting weights (kl is off)


def test_activation_bytes_count_one_prompts_logits_of_every_new_token():
    pm = nesgpu.PerturbedModel(nesgpu.convert(tiny_llama(), "lowrank"), 2, sigma=0.1, antithetic=True, seed=1)
    vocab = pm.model.config.vocab_size  # a direction's rows of one prompt (both signs), 5 + 1 positions, 3 copies
    assert task(beta=0.1).activation_bytes(pm) - task().activation_bytes(pm) == 2 * 3 * 6 * vocab * 4


def cli(tmp_path, *args):
    return generation_cli(tmp_path, "--reward", "rw:ones", "--sigma", "0.3", *args)


def test_the_cli_takes_beta_logs_kl_penalty_and_names_its_mistakes(tmp_path):
    write_run_files(tmp_path)
    done = cli(tmp_path, "--beta", "0.05", "--out", "run", "--checkpoint-every", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["kl_penalty"] != ""]
    assert len(rows) == 2 and all(float(row["kl_penalty"]) > 0 for row in rows)
    help_text = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--help"],
                               capture_output=True, text=True, timeout=300).stdout
    assert "--beta" in help_text
    for args, message in ((["--beta", "-1"], "option 'beta' must be >= 0; got -1.0"),
                          (["--beta", "x"], "argument --beta: invalid float value: 'x'"),
                          (["--beta", "0.1", "--fitness", "likelihood", "--temperature", "1", "--generations", "2"],
                           "needs fitness 'reward'")):
        done = cli(tmp_path, *args, "--out", "bad")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr
    # beta defines the run: a resume that changes it is refused (after the weights load: their progress bar)
    done = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--resume", "run", "--steps", "3", "--beta", "0.1",
                           "--trust-run-code"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "options that define the run differ from its checkpoint (beta: 0.05 -> 0.1)" in done.stderr
    other = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "cartpole", "--beta", "0.1",
                            "--steps", "1", "--log", "none"], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path)
    assert other.returncode == 2 and "option 'beta' (= 0.1) applies to task" in other.stderr
    assert "not to task 'cartpole'" in other.stderr and "Traceback" not in other.stderr


def test_the_memory_plan_counts_the_starting_weights_beta_keeps(tmp_path):
    from nesgpu.train import TrainConfig, train

    tiny_llama().save_pretrained(tmp_path / "lm")
    char_tokenizer().save_pretrained(tmp_path / "lm")
    plans = {}
    for beta in (0.0, 0.05):
        lines = []
        cfg = TrainConfig.flat(task="arithmetic", model=f"hf:{tmp_path / 'lm'}", steps=1, population=4, batch_size=2,
                          sigma=0.1, log="none", beta=beta, out=str(tmp_path / f"run{beta}"))
        train(cfg, log=lambda *a, **k: lines.append(" ".join(map(str, a))))
        plans[beta] = next(line for line in lines if line.startswith("memory plan:"))
    assert "starting weights" not in plans[0.0] and "starting weights" in plans[0.05]
