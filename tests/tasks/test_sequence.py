"""Sequence tasks: the data, the seeded batches, the population layout of the fitness, the metrics, the
transformer and the Conv1d classifier, and both through the trainer."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nesgpu
from nesgpu.cli import main
from nesgpu.tasks import Conv1dNet, SequenceTask, SequenceTransformer, make_task
from nesgpu.tasks.sequence import apply_rule
from nesgpu.train import TrainConfig, evaluate_run, train


def quiet(*args, **kwargs):
    pass


def tiny(rule="reverse", **kwargs):
    return SequenceTask(rule, **{**dict(length=4, digits=5, batch_size=3, test_size=50, seed=7), **kwargs})


# ----- data ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["reverse", "sort"])
def test_targets_follow_the_rule_and_inputs_are_shifted_by_one(rule):
    task = tiny(rule)
    x, y = task.batch(1)
    assert x.shape == (3, 8) and y.shape == (3, 4) and x.dtype == y.dtype == torch.long
    digits = x[:, :4]
    for row in range(3):
        s = digits[row].tolist()
        assert y[row].tolist() == (s[::-1] if rule == "reverse" else sorted(s))
    assert (x[:, 4] == task.sep).all() and task.sep == 5 and task.vocab == 6
    assert torch.equal(x[:, 5:], y[:, :-1])  # teacher forcing: the input after SEP is the target, one behind
    assert int(digits.max()) < 5 and int(digits.min()) >= 0
    assert torch.equal(task.y_test, apply_rule(rule, task.x_test[:, :4]))
    assert torch.equal(task.x_test, task.inputs(task.x_test[:, :4]))


def test_batches_are_a_function_of_seed_and_step_and_exclude_the_test_set():
    task = SequenceTask("reverse", length=3, digits=3, batch_size=64, test_size=13, seed=1)
    assert torch.equal(task.batch(5)[0], task.batch(5)[0])
    assert torch.equal(SequenceTask("reverse", length=3, digits=3, batch_size=64, test_size=13, seed=1).batch(5)[0],
                       task.batch(5)[0])  # a new task object (a resumed run) sees the same batch
    assert not torch.equal(task.batch(6)[0], task.batch(5)[0])
    assert not torch.equal(SequenceTask("reverse", length=3, digits=3, batch_size=64, test_size=13, seed=2).batch(5)[0],
                           task.batch(5)[0])
    # the test set is fixed whatever the seed, has no repeats, and no training string is a test string
    assert torch.equal(task.x_test, SequenceTask("reverse", length=3, digits=3, test_size=13, seed=9).x_test)
    test = {tuple(r) for r in task.x_test[:, :3].tolist()}
    assert len(test) == 13
    seen = {tuple(r) for step in range(1, 20) for r in task.batch(step)[0][:, :3].tolist()}
    assert not test & seen
    assert len(seen) == 27 - 13  # every other string turns up


def test_large_string_spaces_draw_distinct_test_strings():
    task = SequenceTask("sort", length=12, digits=10, test_size=300)  # 10^12 strings: no permutation
    assert len({tuple(r) for r in task.x_test[:, :12].tolist()}) == 300


@pytest.mark.parametrize("kwargs,message", [
    (dict(rule="shuffle"), r"unknown rule 'shuffle'; expected one of \['reverse', 'sort'\]"),
    (dict(length=0), "length must be >= 1; got 0"),
    (dict(digits=1), "digits must be >= 2; got 1"),
    (dict(batch_size=0), "batch_size must be >= 1; got 0"),
    (dict(length=2, digits=3, test_size=5), r"test_size must be in \[1, 4\].*got 5"),
])
def test_bad_task_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kwargs)


def test_bad_inputs_name_expected_and_got():
    task = tiny()
    with pytest.raises(ValueError, match=r"expected digit strings of shape \(N, 4\); got \(2, 5\)"):
        task.inputs(torch.zeros(2, 5, dtype=torch.long))
    model = task.make_model((8, 1))
    with pytest.raises(ValueError, match=r"expected token ids of shape \(N, T\) with 1 <= T <= 8; got \(2, 9\)"):
        model(torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got \(8,\)"):
        model(torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible by n_heads"):
        task.make_model((6, 1, 4))
    with pytest.raises(ValueError, match=r"hidden must be \(d_model\[, n_layers.*got \(\)"):
        task.make_model(())
    with pytest.raises(ValueError, match=r"unknown model 'mlp' for task 'reverse'; expected one of \['transformer'\]"):
        task.make_model((8,), model="mlp")


# ----- model and metrics -----------------------------------------------------------------------------------
def test_transformer_is_causal_and_built_from_torch_modules():
    task = tiny()
    model = task.make_model((8, 2, 2, 16))
    kinds = {type(m) for m in model.modules()}
    assert {nn.Embedding, nn.TransformerEncoderLayer, nn.LayerNorm, nn.Linear} <= kinds
    assert isinstance(model.positions, nn.Embedding) and len(model.layers) == 2
    assert model.layers[0].linear1.out_features == 16 and model.layers[0].self_attn.num_heads == 2
    x = task.batch(1)[0]
    out = model(x)
    assert out.shape == (3, 8, 6)
    changed = x.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 5  # change only later tokens: earlier outputs must not move
    torch.testing.assert_close(model(changed)[:, :5], out[:, :5])
    assert not torch.allclose(model(changed)[:, 5:], out[:, 5:])


class Oracle(nn.Module):
    """Predicts each target from the true digits: a perfect model (logits one-hot on the answer)."""

    def __init__(self, task, wrong_position=None):
        super().__init__()
        self.task, self.wrong_position = task, wrong_position

    def forward(self, tokens):
        y = apply_rule(self.task.rule, tokens[:, :self.task.length])
        if self.wrong_position is not None:  # wrong at one position of the strings that start with an even digit
            y = y.clone()
            even = tokens[:, 0] % 2 == 0
            y[even, self.wrong_position] = (y[even, self.wrong_position] + 1) % self.task.digits
        logits = torch.zeros(*tokens.shape, self.task.vocab)
        logits[:, self.task.length:] = F.one_hot(y, self.task.vocab).float() * 30
        return logits


@pytest.mark.parametrize("rule", ["reverse", "sort"])
def test_a_perfect_predictor_scores_one_and_a_flawed_one_less(rule):
    task = tiny(rule, test_size=40)
    assert task.evaluate(Oracle(task)) == 1.0
    acc = task.accuracies(Oracle(task))
    assert acc["token_accuracy"] == acc["sequence_accuracy"] == 1.0 and acc["test_loss"] < 1e-9
    acc = task.accuracies(Oracle(task, wrong_position=1), batch=7)  # batches of 7 add up to the whole set
    flawed = float((task.x_test[:, 0] % 2 == 0).double().mean())
    assert 0.2 < flawed < 0.8
    assert acc["sequence_accuracy"] == pytest.approx(1 - flawed)
    assert acc["token_accuracy"] == pytest.approx(1 - flawed / 4)


def test_transformer_learns_reversal_with_adamw():
    """The architecture can solve the task (autograd, a few seconds): the ES defaults aim at the same."""
    task = SequenceTask("reverse", length=4, digits=5, batch_size=64, test_size=100)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = task.make_model((16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(1, 151):
        x, y = task.batch(step)
        loss = F.cross_entropy(model(x)[:, 4:].reshape(-1, task.vocab), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert task.accuracies(model)["sequence_accuracy"] > 0.9


# ----- population layout -----------------------------------------------------------------------------------
def _member_losses(task, model, pm, step):
    """Every member's loss, one plain model at a time: (signs, D)."""
    x, y = task.batch(step)
    z = pm.dense_noise()
    out = torch.empty(2, pm.directions, dtype=torch.float64)
    for s, sign in enumerate([1.0, -1.0]):
        for d in range(pm.directions):
            member = copy.deepcopy(model)
            with torch.no_grad():
                for name, p in member.named_parameters():
                    if name in z:
                        p.add_(pm.sigma * sign * z[name][d])
                out[s, d] = F.cross_entropy(member(x)[:, task.length:].reshape(-1, task.vocab), y.flatten())
    return out


@pytest.mark.parametrize("kind", ["gaussian", "lowrank"])
def test_fitness_row_n_is_direction_n_mod_d(kind):
    task = tiny()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nesgpu.convert(task.make_model((8, 1, 2, 8)).double(), kind)
    pm = nesgpu.PerturbedModel(model, 4, sigma=0.2, antithetic=True, seed=3)
    pm.set_noise(step=2)
    names = {n for n, _ in model.named_parameters()}
    assert set(pm.dense_noise()) == names, "every parameter of the transformer is perturbed"
    fitness, info = task.fitness(pm, step=2)
    assert fitness.shape == (2, 4)
    expected = _member_losses(task, model, pm, step=2)
    torch.testing.assert_close(fitness, -expected)
    torch.testing.assert_close(info["train_loss"], expected.mean())
    assert not torch.allclose(fitness[0], fitness[1])  # the signs differ: the noise reaches the loss


# ----- mnist1d Conv1d -------------------------------------------------------------------------------------
def test_conv1d_classifier_shapes_and_errors():
    net = Conv1dNet(40, 10, (4, 6))
    assert net(torch.randn(5, 40)).shape == (5, 10)
    assert [m.out_channels for m in net.modules() if isinstance(m, nn.Conv1d)] == [4, 6]
    assert net.head.in_features == 6 * 10  # 40 -> 20 -> 10
    with pytest.raises(ValueError, match=r"expected inputs of shape \(N, 40\); got \(5, 1, 40\)"):
        net(torch.randn(5, 1, 40))
    with pytest.raises(ValueError, match="channels must be one or more positive sizes; got ()"):
        Conv1dNet(40, 10, ())


def test_classification_task_builds_a_cnn_for_1d_inputs_only():
    from nesgpu.tasks import ClassificationTask

    task = ClassificationTask(torch.randn(30, 12), torch.randint(0, 3, (30,)), torch.randn(9, 12),
                              torch.randint(0, 3, (9,)), batch_size=4, name="toy")
    assert isinstance(task.make_model((4,), model="cnn"), Conv1dNet)
    with pytest.raises(ValueError, match=r"unknown model 'rnn' for task 'toy'; expected one of \['cnn', 'mlp'\]"):
        task.make_model((4,), model="rnn")
    images = ClassificationTask(torch.randn(30, 3, 4), torch.randint(0, 3, (30,)), torch.randn(9, 3, 4),
                                torch.randint(0, 3, (9,)))
    with pytest.raises(ValueError, match=r"model 'cnn' needs 1-D inputs.*got inputs of shape \(N, 3, 4\)"):
        images.make_model((4,), model="cnn")


def test_conv1d_fitness_row_n_is_direction_n_mod_d():
    from nesgpu.tasks import ClassificationTask

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 12, generator=gen, dtype=torch.float64), torch.randint(0, 3, (40,), generator=gen)
    task = ClassificationTask(x, y, x[:8], y[:8], batch_size=5, seed=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nesgpu.convert(task.make_model((3, 4), model="cnn").double(), "gaussian")
    pm = nesgpu.PerturbedModel(model, 3, sigma=0.3, antithetic=True, seed=1)
    pm.set_noise(step=4)
    z = pm.dense_noise()
    assert set(z) == {n for n, _ in model.named_parameters()}, "every Conv1d and Linear parameter is perturbed"
    fitness, _ = task.fitness(pm, step=4)
    xb, yb = task.batch(4)
    for s, sign in enumerate([1.0, -1.0]):
        for d in range(3):
            member = copy.deepcopy(model)
            with torch.no_grad():
                for name, p in member.named_parameters():
                    p.add_(0.3 * sign * z[name][d])
                torch.testing.assert_close(fitness[s, d], -F.cross_entropy(member(xb), yb))


# ----- the trainer and the CLI -----------------------------------------------------------------------------
def test_train_reverse_end_to_end_through_the_cli(tmp_path, capsys):
    out = tmp_path / "rev"
    assert main(["train", "--task", "reverse", "--steps", "2", "--population", "8", "--batch-size", "4",
                 "--hidden", "8,1", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["task"] == "reverse" and summary["metric"] == "test_accuracy" and summary["steps"] == 2
    assert 0.0 <= summary["value"] <= 1.0
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == "transformer" and config["hidden"] == [8, 1]
    assert evaluate_run(out, "cpu")["value"] == pytest.approx(summary["value"])
    assert len((out / "metrics.csv").read_text().strip().splitlines()) == 1 + 1 + 2  # the header, step 0, steps 1-2


def test_train_resumes_reverse_exactly(tmp_path):
    cfg = dict(task="reverse", population=8, batch_size=4, hidden=(8, 1), checkpoint_every=2)
    a = train(TrainConfig.flat(**cfg, steps=4, out=str(tmp_path / "a")), log=quiet)
    train(TrainConfig.flat(**cfg, steps=2, out=str(tmp_path / "b")), log=quiet)
    b = train(TrainConfig.flat(**cfg, steps=4, out=str(tmp_path / "b")), resume=True, log=quiet)
    assert a["value"] == b["value"]
    from safetensors.torch import load_file

    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("options", [dict(chunk_size=2), dict(precision="bf16"), dict(layer="gaussian")])
def test_train_reverse_in_chunks_under_autocast_and_other_kinds(tmp_path, options):
    summary = train(TrainConfig.flat(task="reverse", population=8, batch_size=4, hidden=(8, 1), steps=2,
                                out=str(tmp_path), **options), log=quiet)
    assert 0.0 <= summary["value"] <= 1.0


def test_train_mnist1d_with_the_cnn(tmp_path, capsys):
    out = tmp_path / "cnn"
    assert main(["train", "--task", "mnist1d", "--model", "cnn", "--hidden", "4,4", "--steps", "2",
                 "--population", "8", "--batch-size", "4", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["task"] == "mnist1d" and 0.0 <= summary["value"] <= 1.0
    assert json.loads((out / "config.json").read_text())["model"] == "cnn"
    assert evaluate_run(out, "cpu")["value"] == pytest.approx(summary["value"])


def test_model_defaults_per_task():
    assert TrainConfig(task="mnist1d").resolved().model == "mlp"
    cnn = TrainConfig(task="mnist1d", model="cnn").resolved()
    assert cnn.model == "cnn" and cnn.hidden == (32, 32, 32)
    assert TrainConfig(task="mnist1d", model="cnn", hidden=(8,)).resolved().hidden == (8,)
    assert TrainConfig(task="reverse").resolved().model == "transformer"
    sort = TrainConfig(task="sort").resolved()
    assert sort.model == "transformer" and sort.lr_schedule == "cosine" and sort.hidden == (32, 2)
    assert TrainConfig(task="cartpole").resolved().model == "mlp"


@pytest.mark.parametrize("task,model,choices", [
    ("mnist1d", "rnn", r"\['mlp', 'cnn'\]"),
    ("digits", "cnn", r"\['mlp'\]"),
    ("reverse", "mlp", r"\['transformer'\]"),
    ("cartpole", "cnn", r"\['mlp'\]"),
])
def test_bad_model_is_a_clear_error(tmp_path, capsys, task, model, choices):
    with pytest.raises(ValueError, match=rf"unknown model '{model}' for task '{task}'; expected one of {choices}"):
        TrainConfig(task=task, model=model).resolved()
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--task", task, "--model", model, "--steps", "1", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert f"unknown model '{model}' for task '{task}'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["reverse", "sort"])
def test_make_task_knows_the_sequence_tasks(name):
    task = make_task(name, batch_size=5, seed=3)
    assert isinstance(task, SequenceTask) and task.batch_size == 5 and task.seed == 3
    assert task.rule == name and task.name == name and isinstance(task.make_model((16, 2)), SequenceTransformer)
    assert task.length == 6 and task.digits == 8 and len(task.x_test) == 1000
