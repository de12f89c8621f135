"""A generation task's denser fitnesses: several sampled completions per member, and the likelihood fitness
(each member's importance-weighted expected reward from one teacher-forced population forward), checked against
each member's own model in float64."""

import pytest
import torch
from conftest import CHARS, char_tokenizer
from test_generation import PROMPTS, digit_count, tiny_llama

import nesgpu
from nesgpu.exactness.rows import each_member
from nesgpu.population import Population
from nesgpu.tasks.generation import GenerationTask
from nesgpu.tasks.likelihood import importance_weighted, joined, kept_tokens, sequence_logp

pytest.importorskip("transformers")


def task(**kw):
    options = dict(prompts=PROMPTS, tokenizer=char_tokenizer(), reward=digit_count, max_new_tokens=5,
                   prompts_per_step=3, shaping="none", correct_at=None, temperature=1.0, generations=4,
                   fitness="likelihood", name="digits-count")
    return GenerationTask(**{**options, **kw})


def perturbed(directions=3, dtype=torch.float64):
    pm = nesgpu.PerturbedModel(nesgpu.convert(tiny_llama().to(dtype), "lowrank"), directions, sigma=0.3,
                               antithetic=True, seed=1)
    return pm


def test_importance_weights_give_each_member_its_expected_reward():
    rewards = torch.tensor([[1.0, 0.0, 0.5]])  # one prompt, three completions
    base = torch.log(torch.tensor([0.2, 0.3, 0.5]))
    member = torch.log(torch.tensor([0.6, 0.3, 0.1]))  # one sign, one direction
    logp = member.view(1, 3, 1)
    expected = (0.6 / 0.2 * 1.0 + 0.3 / 0.3 * 0.0 + 0.1 / 0.5 * 0.5) / (0.6 / 0.2 + 1.0 + 0.1 / 0.5)
    torch.testing.assert_close(importance_weighted(logp, base, rewards), torch.tensor([[expected]]))
    same = importance_weighted(base.view(1, 3, 1), base, rewards)  # the plain model: the plain mean
    torch.testing.assert_close(same, rewards.mean(1, keepdim=True))


def test_kept_tokens_end_at_the_first_stop_or_end_of_sequence():
    tok = char_tokenizer()
    new = torch.tensor([[CHARS.index(c) + 3 for c in text] for text in ("12\n45", "12345", "1\n\n\n\n")])
    kept = kept_tokens(tok, new, ("\n",))
    assert kept.sum(1).tolist() == [3, 5, 2]
    eos = new.clone()
    eos[1, 1] = tok.eos_token_id
    assert kept_tokens(tok, eos, ("\n",)).sum(1).tolist() == [3, 2, 2]


def tied_gpt2():
    import transformers as tf

    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=len(CHARS) + 3, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                           tie_word_embeddings=True, bos_token_id=1, eos_token_id=1, pad_token_id=0)
    model = tf.GPT2LMHeadModel(config).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    return model


@pytest.mark.parametrize("make", [tiny_llama, tied_gpt2], ids=["llama", "tied-gpt2"])
def test_likelihood_fitness_is_each_members_own_expected_reward_in_float64(make):
    t = task()
    pm = nesgpu.PerturbedModel(nesgpu.convert(make().to(torch.float64), "lowrank"), 3, sigma=0.3, antithetic=True,
                               seed=1)
    fitness = Population(pm, log=lambda *a: None).evaluate(t, 2, 0.3).fitness
    drawn = t._drawn
    assert drawn.step == 2 and drawn.rewards.shape == (3, 4) and fitness.shape == (2 * 3, 3)
    reference = make().to(torch.float64)
    pm.set_noise(step=2)
    for s, d in each_member(reference, pm):
        own = sequence_logp(reference, drawn.ids, drawn.mask, drawn.kept, 1.0)
        weights = torch.softmax((own - drawn.base).view(3, 4), 1)
        torch.testing.assert_close(fitness[s * 3:(s + 1) * 3, d], (weights * drawn.rewards.double()).sum(1),
                                   rtol=1e-9, atol=1e-9)
    base = sequence_logp(reference, drawn.ids, drawn.mask, drawn.kept, 1.0)
    torch.testing.assert_close(base, drawn.base, rtol=1e-9, atol=1e-9)  # drawn from the plain model


def test_the_base_likelihood_is_what_generate_sampled_from():
    """log p_0 of the drawn completions, teacher-forced, equals the sum of generate()'s own step scores."""
    t, model = task(), tiny_llama().to(torch.float64)
    model.generation_config.eos_token_id = None  # every row samples all 5 tokens
    ids, mask = t.encode_prompts(["1+2=", "37*45=", "-3+10=", "8-9="], model)
    assert (mask == 0).any()  # left padding: positions count from each row's first token
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=5, top_k=0,
                         temperature=1.0, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    new = out.sequences[:, ids.shape[1]:]
    scores = torch.stack([torch.log_softmax(s, -1) for s in out.scores], 1).gather(-1, new.unsqueeze(-1))
    kept = torch.ones_like(new, dtype=torch.bool)
    full, full_mask = joined(ids, mask, new, kept, 0)
    torch.testing.assert_close(sequence_logp(model, full, full_mask, kept, 1.0), scores.squeeze(-1).sum(1).double())


def test_chunked_likelihood_fitness_equals_unchunked_and_draws_once_per_step():
    whole = Population(perturbed(4, torch.float32), log=lambda *a: None).evaluate(task(), 1, 0.3).fitness
    chunked = Population(perturbed(4, torch.float32), chunk=1, log=lambda *a: None).evaluate(task(), 1, 0.3)
    torch.testing.assert_close(chunked.fitness, whole)
    assert chunked.info["env_steps"] == 3 * 4 * 5  # drawn once: prompts x samples x tokens


@pytest.mark.parametrize("antithetic, chunk", [(True, None), (False, None), (True, 2)])
def test_a_prompt_whose_completions_all_scored_alike_gives_every_member_exactly_that_without_a_forward(antithetic,
                                                                                                        chunk):
    alike = PROMPTS[:6]  # every completion of these scores 0.1: importance weights would sum to 1 only up to rounding

    def reward(prompts, completions):
        return torch.tensor([0.1 if p in alike else float(sum(ch.isdigit() for ch in c))
                             for p, c in zip(prompts, completions)])

    t = task(reward=reward, prompts_per_step=6)  # raw fitness; shaped below
    pm = nesgpu.PerturbedModel(nesgpu.convert(tiny_llama(), "lowrank"), 4, sigma=0.3, antithetic=antithetic, seed=1)
    rows, signs = [], 2 if antithetic else 1
    hook = pm.model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
    result = Population(pm, chunk=chunk, log=lambda *a: None).evaluate(t, 0, 0.3)
    hook.remove()
    prompts = t.step_prompts(0)
    same = torch.tensor([p in alike for p in prompts])
    assert 0 < same.sum() < len(prompts) and not t._drawn.rewards[~same].eq(0.1).all()  # both kinds this step
    by_prompt = result.fitness.view(signs, len(prompts), 4)
    assert by_prompt[:, same].eq(0.1).all()  # exactly, for every member
    varied = t._drawn.rewards.amax(1) > t._drawn.rewards.amin(1)
    blocks = 1 if chunk is None else 4 // chunk
    assert set(rows[:-blocks]) == {6 * 4}  # the draw: the plain model's generate() of prompts x completions
    # then a forward per block: signs x its directions x varied prompts x completions
    assert rows[-blocks:] == [signs * (4 // blocks) * int(varied.sum()) * 4] * blocks
    assert t.describe(result.fitness)["prompts_with_spread"] <= varied.float().mean()
    shaped = task(reward=reward, prompts_per_step=6, shaping="per_prompt").shape(result.fitness)
    assert shaped.view(signs, len(prompts), 4)[:, same].eq(0).all()  # no signal, where rounding would have made one


def test_several_samples_average_each_members_rewards():
    t = task(fitness="reward", generations=3)
    pm = perturbed(2, torch.float32)
    result = Population(pm, log=lambda *a: None).evaluate(t, 1, 0.3)
    assert result.fitness.shape == (2 * 3, 2)
    assert result.info["env_steps"] == 2 * 3 * 3 * 2 * 5  # signs x prompts x samples x directions x tokens
    # each value is a mean of 3 digit counts: a multiple of 1/3
    torch.testing.assert_close(result.fitness * 3, (result.fitness * 3).round())


def test_members_whose_samples_scored_the_same_values_in_another_order_tie_exactly():
    values, k, d = [0.1, 1.0, 0.3, 0.7], 4, 3  # summed in another order, these differ in the last bit

    def rotated(prompts, completions):  # rows run (sign, prompt, sample, direction): direction j's samples rotated
        return torch.tensor([values[(n // d % k + n % d) % k] for n in range(len(completions))])

    t = task(fitness="reward", generations=k, reward=rotated)
    fitness = Population(perturbed(d, torch.float32), log=lambda *a: None).evaluate(t, 0, 0.3).fitness
    assert fitness.eq(fitness[0, 0]).all()
    shaped = task(fitness="reward", generations=k, reward=rotated, shaping="per_prompt").shape(fitness)
    assert shaped.eq(0).all()  # no signal where there is none


@pytest.mark.parametrize("options, message", [
    (dict(fitness="dense"), r"fitness must be one of \['reward', 'likelihood'\]; got 'dense'"),
    (dict(generations=1), "needs generations >= 2 and a temperature above 0; got generations 1"),
    (dict(temperature=0.0), "needs generations >= 2 and a temperature above 0; got generations 4, temperature 0.0"),
    (dict(fitness="reward", temperature=0.0), "generations 4 needs a temperature above 0"),
    (dict(generations=0), "generations must be an int >= 1; got 0"),
])
def test_bad_sampling_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        task(**options)


def test_a_resumed_likelihood_run_equals_a_straight_one(tmp_path):
    import dataclasses

    from safetensors.torch import load_file

    from nesgpu.train import TrainConfig, train

    quiet = dict(log=lambda *a, **k: None)
    cfg = TrainConfig(steps=4, population=8, sigma=0.5, lr=0.01, eval_every=2, checkpoint_every=2, log="none",
                      out=str(tmp_path / "straight"))
    train(cfg, model=tiny_llama(), task=task(shaping="per_prompt"), **quiet)
    train(dataclasses.replace(cfg, steps=2, out=str(tmp_path / "split")), model=tiny_llama(),
          task=task(shaping="per_prompt"), **quiet)
    train(dataclasses.replace(cfg, out=str(tmp_path / "split")), model=tiny_llama(seed=9),
          task=task(shaping="per_prompt"), resume=True, **quiet)
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("straight", "split"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = tiny_llama().state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a if k in start)  # it trained


def test_activation_bytes_count_the_likelihood_fitness_logits_of_every_new_token():
    pm = perturbed(2, torch.float32)
    reward, likelihood = task(fitness="reward"), task()
    vocab = pm.model.config.vocab_size
    rows = 2 * 3 * 4  # signs x prompts x generations
    assert likelihood.activation_bytes(pm) - reward.activation_bytes(pm) == rows * 2 * 5 * vocab * 4
