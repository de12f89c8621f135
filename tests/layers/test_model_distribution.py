"""PerturbedModel.distribution: the one search distribution a model samples from (isotropic, scales or a
covariance), read from what it holds, and the one rule that it holds at most one of scales and a covariance."""

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.layers.model_distribution import COVARIANCE, ISOTROPIC, SCALES


def model():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    return nesgpu.PerturbedModel(nesgpu.convert(net, "gaussian"), 4, sigma=0.1)


def test_the_distribution_follows_what_the_model_holds():
    pm = model()
    assert pm.distribution == ISOTROPIC
    pm.set_scales(pm.unit_scales())
    pm.set_scales({name: 2 * s for name, s in pm.unit_scales().items()})  # replacing scales is no conflict
    assert pm.distribution == SCALES
    pm.set_scales(None)
    assert pm.distribution == ISOTROPIC
    pm.set_covariance(torch.eye(pm.num_perturbed))
    pm.set_covariance(2 * torch.eye(pm.num_perturbed))  # nor is replacing the covariance
    pm.set_scales({})  # no scales: nothing set beside it
    assert pm.distribution == COVARIANCE
    pm.set_covariance(None)
    assert pm.distribution == ISOTROPIC


def test_one_distribution_beside_the_other_is_refused_and_changes_nothing():
    pm = model()
    pm.set_scales(pm.unit_scales())
    with pytest.raises(ValueError, match="a covariance replaces it: set_scales\\(None\\) first"):
        pm.set_covariance(torch.eye(pm.num_perturbed))
    assert pm.distribution == SCALES and pm.covariance_factor() is None
    pm.set_scales(None)
    pm.set_covariance(torch.eye(pm.num_perturbed))
    with pytest.raises(ValueError, match="scales cannot be set beside it: set_covariance\\(None\\) first"):
        pm.set_scales(pm.unit_scales())
    assert pm.distribution == COVARIANCE and pm.scales() == {}
    with pytest.raises(ValueError, match="subspace below 1 .* sigma per parameter or a covariance"):
        pm.set_subspace(0.5)
    assert pm.subspace == 1.0


def test_a_subspace_per_step_refuses_scales_and_a_covariance_before_either_is_set():
    pm = model()
    pm.set_subspace(0.5)
    for set_, what in ((lambda: pm.set_scales(pm.unit_scales()), "sigma per parameter"),
                       (lambda: pm.set_covariance(torch.eye(pm.num_perturbed)), "covariance")):
        with pytest.raises(ValueError, match=f"set_subspace\\(0.5\\)\\), whose zero noise a {what} would adapt"):
            set_()
        assert pm.distribution == ISOTROPIC and pm.scales() == {}  # nothing set
    pm.set_scales(None)  # removing none is no conflict
