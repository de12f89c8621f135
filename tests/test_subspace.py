"""Subspace ES (``subspace`` of openai_es and ars, ``PerturbedModel.set_subspace``): each step perturbs and updates
a random subset of the perturbed modules, chosen by (seed, step) alone. Every noise kind's population is exactly
the dense per-member reference with the plain weights outside the subset; the update leaves those weights (and
Adam's moments) alone; runs are bit-identical chunked, resumed and over torchrun (tests/train/test_distributed.py)."""

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.func import functional_call

import nesgpu
from nesgpu.cli import main
from nesgpu.kinds import KINDS  # every registered kind
from nesgpu.layers.subspace import subspace_modules
from nesgpu.population import Population
from nesgpu.strategies import ARS, OpenAIES
from nesgpu.train import TrainConfig, train
from nesgpu.train.steps.evolution import EvolutionStep

D, SIGMA, STEP = 4, 0.1, 2


def small_model(kind):
    """2-3 Linear layers, behind an Embedding for the kinds that take one; float64."""
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)]
    if kind in ("gaussian", "lowrank"):
        layers = [nn.Embedding(10, 6), *layers]
    return nesgpu.convert(nn.Sequential(*layers).double(), kind)


def model_input(kind, rows):
    gen = torch.Generator().manual_seed(1)
    if kind in ("gaussian", "lowrank"):
        return torch.randint(0, 10, (rows, 5), generator=gen)
    return torch.randn(rows, 6, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_evaluates_the_dense_reference_on_the_subset_and_the_plain_weights_elsewhere(kind):
    pm = nesgpu.PerturbedModel(small_model(kind), D, sigma=SIGMA, antithetic=True, seed=3)
    pm.set_noise(step=STEP)
    full = pm.dense_noise()  # every module's noise at STEP
    pm.set_subspace(0.5)  # draws the current noise again, zero outside the subset
    inside = pm.subspace_modules(STEP)
    assert 0 < len(inside) < sum(layer.perturbs for layer in pm.layers.values())  # a proper subset
    x = model_input(kind, 2 * D)
    got = pm(x)
    params = dict(pm.model.named_parameters())
    for name, z in pm.dense_noise().items():
        module = name.rpartition(".")[0]
        if module in inside:
            assert torch.equal(z, full[name]), name
        else:
            assert not z.any(), name  # all zero: the plain weights in every member
    for row in range(2 * D):
        sign, d = (1 if row < D else -1), row % D
        member = {n: p + SIGMA * sign * full[n][d] if n.rpartition(".")[0] in inside else p for n, p in params.items()}
        expected = functional_call(pm.model, member, (x[row:row + 1],))
        torch.testing.assert_close(got[row:row + 1], expected, rtol=1e-10, atol=1e-10)
    norms = sum(z.flatten(1).square().sum(1) for n, z in full.items() if n.rpartition(".")[0] in inside)
    torch.testing.assert_close(pm.noise_sq_norms(), norms, rtol=1e-12, atol=0)


def test_the_subset_depends_on_the_seed_and_step_alone_and_holds_about_its_share():
    torch.manual_seed(0)
    net = nesgpu.convert(nn.Sequential(*[nn.Linear(4, 4) for _ in range(40)]).double(), "lowrank")
    pm = nesgpu.PerturbedModel(net, 8, sigma=SIGMA, antithetic=True, seed=5)
    pm.set_subspace(0.25)
    pm.set_noise(step=STEP)
    whole = pm.dense_noise()
    for block in (range(0, 3), range(3, 8)):  # a block of directions, as a chunk or another process draws it
        pm.set_noise(step=STEP, directions=block)
        for name, z in pm.dense_noise().items():
            assert torch.equal(z, whole[name][block.start:block.stop]), name
    subsets = [pm.subspace_modules(step) for step in range(1, 21)]
    assert len(set(subsets)) == 20  # every step its own
    assert all(0.25 <= pm.subspace_share(step) < 0.25 + 1 / 40 + 1e-12 for step in range(1, 21))
    counts = {name: layer.perturbed_numel() for name, layer in pm.layers.items()}
    assert subspace_modules(counts, 0.25, 5, STEP) == pm.subspace_modules(STEP)  # the rule, as a plain function
    assert subspace_modules(counts, 0.25, 6, STEP) != pm.subspace_modules(STEP)
    assert subspace_modules(counts, 1.0, 5, STEP) == set(counts)
    assert len(subspace_modules(counts, 1e-9, 5, STEP)) == 1  # at least one module


class Rows:
    """Fitness: each member's output summed on one input that every member sees."""

    metric, default_target, summed_info = "none", None, frozenset()

    def fitness(self, pm, step):
        out = pm(pm.member_rows(torch.ones(1, 3, dtype=torch.float64))).sum(-1)
        return out.view(2, pm.local_directions), {}

    def finish_step(self, pm, info):
        pass

    def evaluate(self, model):
        return 0.0


def es_step(update, chunk=None):
    torch.manual_seed(0)
    net = nesgpu.convert(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)),
                         "lowrank").double()
    pm = nesgpu.PerturbedModel(net, 6, sigma=SIGMA, antithetic=True, seed=3)
    strategy = OpenAIES(6, weight_decay=0.1, subspace=0.4)
    return EvolutionStep(Rows(), Population(pm, chunk=chunk, log=lambda *a: None), strategy, SIGMA, lr=0.01,
                         update=update)


@pytest.mark.parametrize("update", ["strategy", "adam"])  # torch Adam over .grad (with L2), Adam in place
def test_a_step_moves_only_its_subset_and_its_moments(update):
    step = es_step(update)
    pm, moved = step.population.pm, set()
    for t in range(1, 7):
        before = {n: p.detach().clone() for n, p in pm.model.named_parameters()}
        moments = {n: {k: v.clone() for k, v in step.optimizer.state[p].items()}
                   for n, p in pm.model.named_parameters()}
        stats = step.run()
        inside = pm.subspace_modules(t)
        assert stats["subspace_share"] == pm.subspace_share(t) < 1
        for n, p in pm.model.named_parameters():
            module = n.rpartition(".")[0]
            if module in inside:
                moved.add(module)
                assert not torch.equal(p, before[n]), (t, n)
            else:
                assert torch.equal(p, before[n]), (t, n)
                assert step.optimizer.state[p].keys() == moments[n].keys()
                assert all(torch.equal(v, step.optimizer.state[p][k]) for k, v in moments[n].items()), (t, n)
    assert moved == {"0", "2", "4"}
    assert "subspace_share" in step.columns


def test_the_in_place_update_is_bit_identical_whatever_the_chunk():
    whole, chunked = es_step("sgd"), es_step("sgd", chunk=4)
    for _ in range(4):
        whole.run(), chunked.run()
    for p, q in zip(whole.model.parameters(), chunked.model.parameters()):
        assert torch.equal(p, q)


FAST = dict(task="digits", population=16, steps=6, batch_size=8, hidden=(8, 8), subspace=0.5, checkpoint_every=2,
            log="none")


def quiet(*args, **kwargs):
    pass


@pytest.mark.parametrize("strategy, update", [("openai_es", "strategy"), ("ars", "sgd")])
def test_a_run_is_bit_identical_resumed_and_chunked(tmp_path, monkeypatch, strategy, update):
    cfg = dict(FAST, strategy=strategy, update=update)
    train(TrainConfig.flat(**cfg, out=str(tmp_path / "whole")), log=quiet)
    train(TrainConfig.flat(**cfg, chunk_size=3, out=str(tmp_path / "chunked")), log=quiet)
    from nesgpu.tasks import ClassificationTask

    original = ClassificationTask.fitness

    def crash_at_step_4(self, pm, step):
        if step == 4:
            raise KeyboardInterrupt
        return original(self, pm, step)

    monkeypatch.setattr(ClassificationTask, "fitness", crash_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig.flat(**cfg, out=str(tmp_path / "split")), log=quiet)
    monkeypatch.setattr(ClassificationTask, "fitness", original)
    train(TrainConfig.flat(**cfg, out=str(tmp_path / "split")), resume=True, log=quiet)
    whole = load_file(tmp_path / "whole" / "model.safetensors")
    split, chunked = (load_file(tmp_path / run / "model.safetensors") for run in ("split", "chunked"))
    for name in whole:
        assert torch.equal(whole[name], split[name]), name
        # the digits MLP's products over blocks of another size round differently, with a subspace or without
        # (the same subset, exactly: test_the_in_place_update_is_bit_identical_whatever_the_chunk)
        torch.testing.assert_close(whole[name], chunked[name], rtol=1e-4, atol=1e-5)
    header = (tmp_path / "whole" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "subspace_share" in header


@pytest.mark.parametrize("value, error", [(0, ValueError), (1.5, ValueError), ("x", ValueError), (-0.5, ValueError)])
def test_a_bad_subspace_is_refused_naming_the_option(value, error):
    for make in (lambda: OpenAIES(4, subspace=value), lambda: ARS(4, subspace=value)):
        with pytest.raises(error, match="subspace"):
            make()
    pm = nesgpu.PerturbedModel(small_model("lowrank"), D, sigma=SIGMA, antithetic=True)
    with pytest.raises((TypeError, ValueError), match="subspace"):
        pm.set_subspace(value)
    with pytest.raises((TypeError, ValueError), match="subspace"):
        TrainConfig.flat(task="digits", subspace=value).resolved()


def test_a_model_with_a_sigma_per_parameter_or_a_covariance_takes_no_subspace():
    pm = nesgpu.PerturbedModel(small_model("gaussian"), D, sigma=SIGMA, antithetic=True)
    pm.set_scales(pm.unit_scales())
    with pytest.raises(ValueError, match="subspace below 1 .* sigma per parameter or a covariance"):
        pm.set_subspace(0.5)
    pm.set_scales(None)
    pm.set_subspace(0.5)
    with pytest.raises(ValueError, match=r"set_subspace\(1\) first"):
        pm.set_covariance(torch.eye(pm.num_perturbed))


@pytest.mark.parametrize("strategy", ["snes", "cma_es", "backprop"])
def test_the_cli_refuses_a_subspace_where_it_cannot_apply_in_one_line(tmp_path, capsys, strategy):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--task", "digits", "--strategy", strategy, "--subspace", "0.5", "--steps", "1",
              "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"option 'subspace' (= 0.5) applies to strategy 'openai_es' or 'ars', not to strategy '{strategy}'" in err
