"""A sigma per parameter (PerturbedModel.set_scales): member (r, d) evaluates theta + sigma * s_r * (S o z_d), the
update reads S o z_d, and scale_statistics gives sum_d w_d (z_d o z_d - 1) of the unit noise; in float64."""

import pytest
import torch
from torch import nn
from torch.func import functional_call

import nesgpu
from nesgpu.kinds import gaussian

SIGMA = 0.3


def random_scales(pm, names=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {name: 0.2 + 2 * torch.rand(z.shape[1:], generator=gen, dtype=z.dtype)
            for name, z in pm.dense_noise().items() if names is None or name in names}


def member_rows(net, pm, x, noise, repeats):
    """Row n = (r, d) through the plain module with theta + sigma s_r noise_d (noise: the dense noise evaluated)."""
    d_count, rows = pm.local_directions, []
    for n in range(repeats * d_count):
        r, d = divmod(n, d_count)
        s = -1.0 if pm.antithetic and r >= repeats // 2 else 1.0
        params = {name: net.get_parameter(name) + SIGMA * s * z[d] for name, z in noise.items()}
        rows.append(functional_call(net, params, (x[n:n + 1],)))
    return torch.cat(rows)


def linear():
    return nesgpu.convert(nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double(), "gaussian")


CASES = {  # (model, population input of R * D rows, the parameters that get a scale: None for all)
    "linear": (linear, lambda n: torch.randn(n, 5, dtype=torch.float64), None),
    "conv": (lambda: nesgpu.convert(nn.Conv2d(4, 6, 3, padding=1, groups=2).double(), "gaussian"),
             lambda n: torch.randn(n, 4, 5, 5, dtype=torch.float64), None),
    "embedding": (lambda: nesgpu.convert(nn.Embedding(7, 3, padding_idx=0).double(), "gaussian"),
                  lambda n: torch.randint(0, 7, (n, 6)), None),
    "lowrank_bias": (lambda: nesgpu.convert(nn.Linear(5, 4).double(), "lowrank", rank=2),
                     lambda n: torch.randn(n, 5, dtype=torch.float64), {"bias"}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("antithetic", [False, True])
def test_the_population_evaluates_theta_plus_sigma_s_r_times_scaled_noise(case, antithetic):
    make, inputs, names = CASES[case]
    torch.manual_seed(0)
    net, directions, repeats = make(), 5, 4
    pm = nesgpu.PerturbedModel(net, directions, sigma=SIGMA, antithetic=antithetic, seed=3)
    pm.set_noise(step=1)
    unit = pm.dense_noise()
    scales = random_scales(pm, names)
    pm.set_scales(scales)  # redraws the current noise with S
    noise = pm.dense_noise()
    for name, z in unit.items():  # dense_noise is S o z_d, the same z_d; parameters without a scale keep S = 1
        assert torch.equal(noise[name], z * scales[name] if name in scales else z), name
    x = inputs(repeats * directions)
    torch.testing.assert_close(pm(x), member_rows(net, pm, x, noise, repeats), rtol=1e-12, atol=1e-12)
    if case == "embedding":  # the padding row stays unperturbed
        assert not noise["weight"][:, 0].any()


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("shape", ["D", "RD"])
def test_update_statistics_and_means_equal_their_formulas(antithetic, shape):
    torch.manual_seed(1)
    net, directions, repeats = linear(), 6, 4
    pm = nesgpu.PerturbedModel(net, directions, sigma=SIGMA, antithetic=antithetic, seed=5)
    pm.set_noise(step=2)
    unit = pm.dense_noise()
    scales = random_scales(pm, seed=1)
    pm.set_scales(scales)
    weights = torch.randn(directions if shape == "D" else (repeats, directions), dtype=torch.float64)
    if shape == "D":
        w_update = w_stat = weights
    else:
        signs = torch.tensor([-1.0 if antithetic and r >= repeats // 2 else 1.0 for r in range(repeats)],
                             dtype=torch.float64)
        w_update = (signs.view(-1, 1) * weights).mean(0)  # update: 1/R sum_r s_r w[r, d]
        w_stat = weights.sum(0)  # the statistic: sum_r w[r, d], no sign (a pair shares z_d o z_d), no 1/R
    w_mean = w_update * (1 if shape == "D" else repeats)  # the means: sum_r s_r w[r, d], with the signs, no 1/R
    pm.update(weights)
    stats, means = pm.scale_statistics(weights), pm.scale_means(weights)
    assert set(stats) == set(unit) == set(means)
    for name, z in unit.items():
        torch.testing.assert_close(means[name], torch.einsum("d,d...->...", w_mean, z), rtol=1e-12, atol=1e-12)
        expected = torch.einsum("d,d...->...", w_update, scales[name] * z) / (directions * SIGMA)
        torch.testing.assert_close(net.get_parameter(name).grad, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(stats[name], torch.einsum("d,d...->...", w_stat, z * z - 1), rtol=1e-12,
                                   atol=1e-12)
        assert stats[name].dtype == torch.float64 and stats[name].shape == net.get_parameter(name).shape


def test_an_antithetic_pair_weighs_its_members_without_their_signs():
    pm = nesgpu.PerturbedModel(linear(), 3, sigma=SIGMA, antithetic=True, seed=1)
    pm.set_noise()
    pm.set_scales(random_scales(pm))
    u = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    paired = pm.scale_statistics(torch.stack([u, u]))  # both members of each pair weigh u_d
    single = pm.scale_statistics(2 * u)
    for name in paired:
        torch.testing.assert_close(paired[name], single[name], rtol=1e-14, atol=1e-14)


def test_chunks_add_up_to_the_whole_population():
    torch.manual_seed(2)
    net, directions = linear(), 40  # over a generator block of 32 directions
    pm = nesgpu.PerturbedModel(net, directions, sigma=SIGMA, antithetic=True, seed=7)
    pm.set_noise(step=4)
    pm.set_scales(random_scales(pm, seed=2))
    weights = torch.randn(2, directions, dtype=torch.float64)
    whole_noise, whole_stats = pm.dense_noise(), pm.scale_statistics(weights)
    pm.update(weights)
    whole_grads = {name: net.get_parameter(name).grad.clone() for name in whole_noise}
    net.zero_grad(set_to_none=True)
    stats, noise = {}, {name: [] for name in whole_noise}
    for part in (range(0, 13), range(13, 35), range(35, 40)):
        pm.set_noise(step=4, directions=part)
        for name, z in pm.dense_noise().items():
            noise[name].append(z)
        for name, s in pm.scale_statistics(weights[:, part.start:part.stop]).items():
            stats[name] = s if name not in stats else stats[name] + s
        pm.update(weights[:, part.start:part.stop])
    for name in whole_noise:
        assert torch.equal(torch.cat(noise[name]), whole_noise[name])  # each block scaled as the whole
        torch.testing.assert_close(stats[name], whole_stats[name], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(net.get_parameter(name).grad, whole_grads[name], rtol=1e-12, atol=1e-12)


def test_the_statistic_in_blocks_equals_it_at_once(monkeypatch):
    z = torch.randn(9, 4, 5, dtype=torch.float64)
    scale, w = 0.5 + torch.rand(4, 5, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
    expected = torch.einsum("d,d...->...", w, (z / scale) ** 2 - 1)
    torch.testing.assert_close(gaussian.weighted_squares(z, w, scale), expected, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(gaussian, "STATISTIC_BLOCK", 45)  # two directions per block, and an odd one at the end
    torch.testing.assert_close(gaussian.weighted_squares(z, w, scale), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gaussian.weighted_squares(z, w), torch.einsum("d,d...->...", w, z * z - 1))


def test_scales_keep_the_random_stream_and_persist_across_steps():
    plain = nesgpu.PerturbedModel(linear(), 4, sigma=SIGMA, seed=9)
    scaled = nesgpu.PerturbedModel(linear(), 4, sigma=SIGMA, seed=9)
    plain.set_noise(step=1)
    scaled.set_noise(step=1)
    scales = random_scales(scaled)
    scaled.set_scales(scales)
    kept = scaled.scales()
    assert kept.keys() == scales.keys()
    w = torch.randn(4, dtype=torch.float64)
    for step in (2, 3):
        plain.set_noise(step=step)
        scaled.set_noise(step=step)
        unit, noise = plain.dense_noise(), scaled.dense_noise()
        assert all(scaled.scales()[name] is kept[name] for name in kept)  # the same tensors, not noise
        for name, z in unit.items():
            assert torch.equal(noise[name], z * scales[name])
        for name, stat in scaled.scale_statistics(w).items():
            torch.testing.assert_close(stat, plain.scale_statistics(w)[name], rtol=1e-12, atol=1e-12)
    scaled.set_scales(None)  # back to S = 1: the current noise is drawn again without them
    assert scaled.scales() == {}
    assert all(torch.equal(scaled.dense_noise()[name], z) for name, z in plain.dense_noise().items())


def test_set_scales_copies_onto_the_parameters_device_and_dtype():
    pm = nesgpu.PerturbedModel(nesgpu.convert(nn.Linear(3, 2), "gaussian"), 2)  # float32
    given = torch.full((2, 3), 0.5, dtype=torch.float64)
    pm.set_scales({"weight": given})
    kept = pm.scales()["weight"]
    assert kept.dtype == torch.float32 and kept is not given
    given.fill_(3.0)  # the caller's tensor is not the model's
    assert bool((pm.scales()["weight"] == 0.5).all())
    half = nesgpu.PerturbedModel(nesgpu.convert(nn.Linear(3, 2).bfloat16(), "gaussian"), 2)
    half.set_scales({"weight": torch.ones(2, 3, dtype=torch.bfloat16)})
    assert half.scales()["weight"].dtype == torch.float32  # as its noise: float32 for a half-precision parameter
    half.set_noise()
    assert half.scale_statistics(torch.ones(2))["weight"].dtype == torch.float32


BAD = [
    ({"0.weight": torch.eye(4, 5) + 1}, ValueError, r"'0\.weight'.*kind 'lowrank' takes a scale that is an outer "
                                                     r"product"),
    ({"nope.weight": torch.ones(4)}, ValueError, r"'nope\.weight' is not a perturbed parameter.*'0\.bias'"),
    ({"0.bias": torch.ones(5)}, ValueError, r"'0\.bias'.*shape \(4,\); got \(5,\)"),
    ({"0.bias": torch.tensor([1.0, 0.0, 1.0, 1.0])}, ValueError, r"'0\.bias'.*in \(0, 1e\+18\].*got 0\.0 at \[1\]"),
    ({"0.bias": torch.tensor([1.0, 1.0, -2.0, 1.0])}, ValueError, r"'0\.bias'.*\(0, .*got -2\.0 at \[2\]"),
    ({"0.bias": torch.tensor([float("nan"), 1.0, 1.0, 1.0])}, ValueError, r"'0\.bias'.*\(0, .*got nan at \[0\]"),
    ({"0.bias": torch.tensor([1.0, float("inf"), 1.0, 1.0])}, ValueError, r"'0\.bias'.*\(0, .*got inf"),
    # a diverged SNES (--scale-lr 1e9) reached 3.4e38: finite, and a checkpoint resume then mis-named
    ({"0.bias": torch.tensor([1.0, 3.4e38, 1.0, 1.0])}, ValueError, r"'0\.bias'.*in \(0, 1e\+18\].*got 3\.\d+e\+38"),
    ({"0.bias": torch.ones(4, dtype=torch.int64)}, TypeError, r"'0\.bias'.*floating-point.*got dtype torch\.int64"),
    ({"0.bias": [1.0, 1.0, 1.0, 1.0]}, TypeError, r"'0\.bias'.*torch\.Tensor.*got list"),
    ([("0.bias", torch.ones(4))], TypeError, r"scales must be a dict.*got list"),
]


@pytest.mark.parametrize("scales, error, match", BAD, ids=range(len(BAD)))
def test_bad_scales_are_refused_by_name_and_change_nothing(scales, error, match):
    net = nesgpu.convert(nn.Sequential(nn.Linear(5, 4)), "lowrank", rank=2)  # its bias is gaussian, its matrix not
    pm = nesgpu.PerturbedModel(net, 3, sigma=SIGMA)
    pm.set_noise()
    good = torch.full((4,), 2.0)
    pm.set_scales({"0.bias": good})
    before = pm.dense_noise()
    with pytest.raises(error, match=match):
        pm.set_scales(scales)
    assert torch.equal(pm.scales()["0.bias"], good) and list(pm.scales()) == ["0.bias"]
    assert all(torch.equal(z, before[name]) for name, z in pm.dense_noise().items())
    assert set(pm.scale_statistics(torch.ones(3))) == {"0.bias", "0.weight"}  # low-rank: as row x column


def test_the_statistic_checks_its_weights_like_the_update():
    pm = nesgpu.PerturbedModel(linear(), 4, sigma=SIGMA, antithetic=True)
    pm.set_noise()
    with pytest.raises(ValueError, match=r"shape \(4,\) or \(R, 4\); got \(3,\)"):
        pm.scale_statistics(torch.ones(3))
    with pytest.raises(ValueError, match="even number of repeats"):
        pm.scale_statistics(torch.ones(3, 4))
    with pytest.raises(TypeError, match="floating-point"):
        pm.scale_statistics(torch.ones(4, dtype=torch.int64))


@pytest.mark.parametrize("family", ["gpt2", "gpt_oss"])  # Conv1D stored (in, out); expert banks with biases, (in, out)
def test_transposed_matrices_and_expert_banks_take_scales_in_their_own_layout(family):
    tf = pytest.importorskip("transformers")
    common = dict(vocab_size=31, num_hidden_layers=1, num_attention_heads=4, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    if family == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=16, n_head=4, n_positions=16, n_layer=1, vocab_size=31))
    else:
        model = tf.GptOssForCausalLM(tf.GptOssConfig(**common, hidden_size=16, intermediate_size=24, head_dim=4,
                                                     num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                                     max_position_embeddings=16, layer_types=["full_attention"],
                                                     experts_implementation="eager"))  # float64 experts
    net = nesgpu.convert(model.double().eval(), "gaussian")
    pm = nesgpu.PerturbedModel(net, 2, sigma=SIGMA, antithetic=True, seed=4)
    pm.set_noise()
    unit = pm.dense_noise()
    scales = random_scales(pm, seed=3)
    pm.set_scales(scales)
    noise = pm.dense_noise()
    for name, z in unit.items():
        assert torch.equal(noise[name], z * scales[name]), name
    ids = torch.randint(3, 31, (4, 5))
    logits = pm(input_ids=ids).logits
    for row in range(4):
        s = -1.0 if row >= 2 else 1.0
        params = {name: net.get_parameter(name) + SIGMA * s * z[row % 2] for name, z in noise.items()}
        ref = functional_call(net, params, (), {"input_ids": ids[row:row + 1]}).logits[0]
        torch.testing.assert_close(logits[row], ref, rtol=1e-9, atol=1e-9)
    w = torch.tensor([[0.5, -1.5], [2.0, 0.25]], dtype=torch.float64)
    for name, stat in pm.scale_statistics(w).items():
        torch.testing.assert_close(stat, torch.einsum("d,d...->...", w.sum(0), unit[name] ** 2 - 1), rtol=1e-10,
                                   atol=1e-10)


class AtMostTwoRows(nn.Module):
    """A module whose code fails on the population's rows: it goes into the exact fallback at the first call."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        if x.shape[0] > 2:
            raise RuntimeError(f"at most 2 rows; got {x.shape[0]}")
        return self.proj(x).tanh()


def test_scales_stay_with_their_parameters_when_a_module_falls_back():
    torch.manual_seed(3)
    net = nesgpu.convert(nn.Sequential(AtMostTwoRows(), nn.Linear(4, 2)).double(), "gaussian")
    pm = nesgpu.PerturbedModel(net, 2, sigma=SIGMA, seed=2)
    pm.set_noise()
    scales = random_scales(pm, {"0.proj.weight", "1.weight"})
    pm.set_scales(scales)
    x = torch.randn(4, 4, dtype=torch.float64)
    with pytest.warns(UserWarning, match="exact torch.func fallback"):
        out = pm(x)
    assert type(net[0]).__name__.startswith("Functional") and pm.scales().keys() == scales.keys()
    noise = pm.dense_noise()  # the fallback's module draws its own noise (its own key), scaled as before
    torch.testing.assert_close(out, member_rows(net, pm, x, noise, 2), rtol=1e-12, atol=1e-12)
    pm.set_scales(None)
    for name, z in pm.dense_noise().items():
        assert torch.equal(noise[name], z * scales[name] if name in scales else z), name


def lowrank_net():
    return nesgpu.convert(nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double(), "lowrank", rank=2)


def outer_scales(pm, seed=0):
    """A row x column scale for each low-rank matrix, any positive scale for the biases."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, z in pm.dense_noise().items():
        shape = z.shape[1:]
        if len(shape) == 2:
            out[name] = torch.outer(0.2 + 2 * torch.rand(shape[0], generator=gen, dtype=z.dtype),
                                    0.2 + 2 * torch.rand(shape[1], generator=gen, dtype=z.dtype))
        else:
            out[name] = 0.2 + 2 * torch.rand(shape, generator=gen, dtype=z.dtype)
    return out


@pytest.mark.parametrize("antithetic", [False, True])
def test_low_rank_matrices_take_a_row_times_column_scale_on_their_factors(antithetic):
    torch.manual_seed(0)
    net, directions, repeats = lowrank_net(), 5, 4
    pm = nesgpu.PerturbedModel(net, directions, sigma=SIGMA, antithetic=antithetic, seed=3)
    pm.set_noise(step=1)
    unit = pm.dense_noise()
    scales = outer_scales(pm)
    pm.set_scales(scales)
    noise = pm.dense_noise()
    for name, z in unit.items():  # (row o A_d)(col o B_d)^T / sqrt(r) = S o z_d: still rank r
        torch.testing.assert_close(noise[name], z * scales[name], rtol=1e-12, atol=1e-12)
    assert torch.linalg.matrix_rank(noise["0.weight"][0]) == 2
    x = torch.randn(repeats * directions, 5, dtype=torch.float64)
    torch.testing.assert_close(pm(x), member_rows(net, pm, x, noise, repeats), rtol=1e-12, atol=1e-12)


def test_the_low_rank_statistic_is_per_factor_and_chunks_add_up():
    """sum_d w_d mean_k(A~_dki^2 - 1) + sum_d w_d mean_k(B~_dkj^2 - 1) for entry (i, j), A~ and B~ the unit
    factors (the search distribution is a diagonal Gaussian over them); no dense (D, out, in) tensor."""
    torch.manual_seed(1)
    net, directions = lowrank_net(), 6
    pm = nesgpu.PerturbedModel(net, directions, sigma=SIGMA, antithetic=True, seed=5)
    pm.set_noise(step=2)
    record = pm.layers["0"].noise_record("weight")
    a, b = record["a"] * 2 ** 0.5, record["b"].clone()  # unit factors: a is drawn over sqrt(r)
    pm.set_scales(outer_scales(pm, seed=2))
    weights = torch.randn(2, directions, dtype=torch.float64)
    w = weights.sum(0)  # both members of a pair share their factors' squares
    rows = torch.einsum("d,dko->o", w, a ** 2 - 1) / 2
    cols = torch.einsum("d,dki->i", w, b ** 2 - 1) / 2
    stats = pm.scale_statistics(weights)
    torch.testing.assert_close(stats["0.weight"], rows[:, None] + cols[None, :], rtol=1e-12, atol=1e-12)
    parts = []
    for block in (range(0, 4), range(4, directions)):
        pm.set_noise(step=2, directions=block)
        parts.append(pm.scale_statistics(weights[:, block.start:block.stop])["0.weight"])
    torch.testing.assert_close(parts[0] + parts[1], stats["0.weight"], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="low-rank noise has no sum_d w_d z_d statistic"):
        pm.scale_means(weights[:, 4:])


def test_a_low_rank_convolution_takes_no_scale_and_a_strategy_names_it():
    from nesgpu.population import Population
    from nesgpu.strategies import CEM, SNES
    from nesgpu.train.steps.evolution import EvolutionStep

    conv = nesgpu.PerturbedModel(nesgpu.convert(nn.Conv1d(2, 3, 3), "lowrank"), 2, sigma=SIGMA)
    with pytest.raises(ValueError, match="'weight'.*kind 'lowrank'.*on a plain matrix only"):
        conv.set_scales({"weight": torch.ones(3, 2, 3)})
    with pytest.raises(ValueError, match="snes adapts a sigma per parameter; weight .kind 'lowrank' on a "
                                         "PerturbedConv1d. cannot carry one: use --layer gaussian"):
        EvolutionStep(None, Population(conv), SNES(2, num_perturbed=conv.num_perturbed), SIGMA)
    linear = nesgpu.PerturbedModel(lowrank_net(), 2, sigma=SIGMA)
    with pytest.raises(ValueError, match="cem adapts a sigma per parameter; 0.weight"):  # its update is not a product
        EvolutionStep(None, Population(linear), CEM(2), SIGMA)
