"""A language model's run with ``subspace`` (a random subset of its modules perturbed and updated per step),
written into the weights in place: chunked and resumed runs are bit-identical to the whole run, and a step leaves
the modules outside its subset as they were."""

import pytest
import torch
from safetensors.torch import load_file
from test_generation import tiny_llama
from test_inplace_generation import task

from nesgpu.train import TrainConfig, train
from nesgpu.train.setup.build import build
from nesgpu.train.setup.own_task import resolve_for


def config(out, steps, chunk=None, update="sgd"):
    return TrainConfig.flat(task="generation", population=4, sigma=0.05, lr=1e-3, steps=steps, chunk_size=chunk,
                       dtype="bfloat16", update=update, subspace=0.5, checkpoint_every=1, out=str(out), log="none")


def quiet(*args, **kwargs):
    pass


@pytest.mark.parametrize("update", ["sgd", "adam"])
def test_chunked_and_resumed_runs_with_a_subspace_are_bit_identical(tmp_path, update):
    def run(name, steps, chunk=None, resume=False):
        train(config(tmp_path / name, steps, chunk, update), model=tiny_llama(), task=task(), resume=resume,
              log=quiet)

    run("whole", 3)
    run("chunked", 3, chunk=1)
    run("split", 2)
    run("split", 3, resume=True)
    whole = load_file(tmp_path / "whole" / "model.safetensors")
    for run_name in ("chunked", "split"):
        other = load_file(tmp_path / run_name / "model.safetensors")
        for name in whole:
            assert torch.equal(whole[name], other[name]), (run_name, name)


def test_a_step_leaves_the_modules_outside_its_subset_as_they_were(tmp_path):
    own = task()
    built = build(resolve_for(config(tmp_path / "r", 2), own), torch.device("cpu"), model=tiny_llama(), task=own,
                  log=quiet)
    pm = built.pm
    before = {name: p.detach().clone() for name, p in pm.model.named_parameters()}
    stats = built.step.run()
    inside = pm.subspace_modules(1)
    assert 0 < stats["subspace_share"] < 1
    changed = {name.rpartition(".")[0] for name, p in pm.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and changed <= inside
