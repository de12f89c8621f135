"""curve.png names every quantity it draws, with its sign: one axis per quantity, RL's returns on one."""

import pytest

pytest.importorskip("matplotlib")

from nesgpu.train.storage.metrics import curve_figure  # noqa: E402

ES = [{"step": s, "fitness_mean": -2.0 + 0.1 * s, "train_loss": 2.0 - 0.1 * s,
       "test_accuracy": 0.1 * s if s % 2 == 0 else None} for s in range(1, 5)]
BACKPROP = [{"step": s, "train_loss": 2.0 - 0.1 * s, "test_accuracy": 0.2} for s in range(1, 5)]
RL = [{"step": s, "fitness_mean": 10.0 * s, "episode_return": 10.0 * s, "eval_return": 12.0 * s} for s in range(1, 4)]
CUSTOM = [{"step": s, "fitness_mean": 0.5 * s, "score": float(s)} for s in range(1, 4)]


def labels(fig):
    import matplotlib.pyplot as plt

    found = [(axis.get_ylabel(), [line.get_label() for line in axis.lines], len(axis.lines)) for axis in fig.axes]
    plt.close(fig)
    return found


def test_a_supervised_es_run_says_its_fitness_is_the_negated_loss():
    (loss, _, n_loss), (metric, _, n_metric) = labels(curve_figure(ES, "test_accuracy", "t"))
    assert loss == "training loss (lower is better)\nES fitness = -loss" and n_loss == 1
    assert metric == "test_accuracy (higher is better)" and n_metric == 1


def test_a_backprop_run_has_no_fitness_to_explain():
    (loss, _, _), _ = labels(curve_figure(BACKPROP, "test_accuracy", "t"))
    assert loss == "training loss (lower is better)"


def test_an_rl_run_draws_both_returns_on_one_axis():
    [(label, lines, count)] = labels(curve_figure(RL, "eval_return", "t"))
    assert label == "return (higher is better)" and count == 2
    assert lines == ["training episodes (mean over the population)", "evaluation (the mean policy)"]


def test_a_custom_task_shows_its_fitness_and_its_metric():
    (fitness, _, _), (metric, _, _) = labels(curve_figure(CUSTOM, "score", "t"))
    assert fitness == "mean fitness (higher is better)" and metric == "score (higher is better)"
