"""The no-signal warning: members tied at the best fitness the run has seen (a saturated reward, CartPole at
500 of 500) are a finished task; otherwise the advice follows what the probe measured, and never asks for a larger
sigma where the probe saw one do worse."""

import pytest

from nesgpu.probe import FLOOR, Probe
from nesgpu.train.steps.signal import SignalWatch, advice


def row(step, high, low, silent):
    return {"step": step, "fitness_max": high, "fitness_min": low, "fitness_mean": (high + low) / 2,
            "no_signal": silent, "sigma": 0.1}


def warnings_of(rows, resumed=(), probe=None):
    lines = []
    watch = SignalWatch(lines.append, resumed)
    for r in rows:
        watch.see(r["step"], r, probe)
    return lines


def test_members_tied_at_the_best_reward_seen_are_a_finished_task_not_a_small_sigma():
    climbing = [row(1, 200.0, 20.0, False), row(2, 480.0, 60.0, False)]
    lines = warnings_of(climbing + [row(step, 500.0, 500.0, True) for step in range(3, 9)])
    assert len(lines) == 1 and "saturated" in lines[0] and "every member scored 500" in lines[0]
    assert "--sigma" not in lines[0] and "to step 5" in lines[0]


def test_ties_at_a_sigma_that_was_given_ask_for_the_probe():
    lines = warnings_of([row(step, 0.0, 0.0, True) for step in range(1, 7)])  # cannot tell: nothing else seen
    assert len(lines) == 1 and "--sigma auto measures" in lines[0] and "saturated" not in lines[0]
    fell = [row(1, 500.0, 20.0, False)] + [row(step, 100.0, 100.0, True) for step in range(2, 8)]
    lines = warnings_of(fell)
    assert len(lines) == 1 and "--sigma auto measures" in lines[0]


def trial(sigma, above, below, signal=0.1):
    return {"sigma": sigma, "prompts_with_spread": above + below, "above": above, "below": below, "signal": signal,
            "drop": below - above, "band": 0.0}


def test_ties_at_a_probed_sigma_never_ask_for_a_larger_sigma():
    probe = Probe(0.00316, "prompts_with_spread", [{"sigma": FLOOR, "prompts_with_spread": 0.0},
                                                   trial(0.001, 0.0, 0.0, 0.0), trial(0.00316, 0.25, 0.0, 0.1),
                                                   trial(0.01, 0.1, 0.3, 0.04)])
    lines = warnings_of([row(step, 0.0, 0.0, True) for step in range(1, 7)], probe=probe)
    assert len(lines) == 1 and "Sigma is not the cause" in lines[0]
    assert "strongest response at sigma 0.00316" in lines[0] and "25% of the members beat the plain model" in lines[0]
    assert "larger sigmas responded less (at 0.01: 0.04 against 0.1)" in lines[0]
    assert "raise" not in lines[0] and "--batch-size" not in lines[0] and "saturated" not in lines[0]


def test_ties_where_no_member_ever_beat_the_plain_model_may_be_a_saturated_reward():
    """A dense reward at 99%: every member scores 1.0 from the first step, and members only ever fall below."""
    probe = Probe(0.001, "prompts_with_spread", [trial(0.001, 0.0, 0.05, 0.02), trial(0.00316, 0.0, 0.6, 0.01)])
    text = advice(0.001, probe)
    assert "no member beat the plain model at any sigma the probe tried" in text and "raise" not in text


@pytest.mark.parametrize("tried", [[{"sigma": 0.1, "signal": 0.5, "drop": 0.1, "local": True, "heard": True}],
                                   [{"sigma": 0.1, "prompts_with_spread": 0.5}]])  # recorded before members counted
def test_ties_after_a_probe_of_another_fitness_ask_for_a_finer_fitness(tried):
    text = advice(0.1, Probe(0.1, "local_response", tried))
    assert "finer-grained" in text and "raise" not in text


def test_a_resumed_run_counts_the_rewards_its_rows_recorded():
    # metrics.csv's rows, as text: the run had climbed from 0.1 to 0.99 before its checkpoint
    resumed = [{"step": "1", "fitness_max": "0.5", "fitness_min": "0.1", "no_signal": "0"},
               {"step": "2", "fitness_max": "0.99", "fitness_min": "0.4", "no_signal": "0"}]
    lines = warnings_of([row(step, 0.99, 0.99, True) for step in range(3, 9)], resumed)
    assert len(lines) == 1 and "saturated" in lines[0] and "0.99" in lines[0]
