"""The no-signal warning: members tied at the best fitness the run has seen (a saturated reward, CartPole at
500 of 500) are a finished task; ties anywhere else are a sigma too small."""

from nesgpu.train.steps.signal import SignalWatch


def row(step, high, low, silent):
    return {"step": step, "fitness_max": high, "fitness_min": low, "fitness_mean": (high + low) / 2,
            "no_signal": silent, "sigma": 0.1}


def warnings_of(rows, resumed=()):
    lines = []
    watch = SignalWatch(lines.append, 0.1, resumed)
    for r in rows:
        watch.see(r["step"], r)
    return lines


def test_members_tied_at_the_best_reward_seen_are_a_finished_task_not_a_small_sigma():
    climbing = [row(1, 200.0, 20.0, False), row(2, 480.0, 60.0, False)]
    lines = warnings_of(climbing + [row(step, 500.0, 500.0, True) for step in range(3, 9)])
    assert len(lines) == 1 and "saturated" in lines[0] and "every member scored 500" in lines[0]
    assert "--sigma" not in lines[0] and "to step 5" in lines[0]


def test_ties_from_the_first_step_or_below_the_best_seen_ask_for_a_larger_sigma():
    lines = warnings_of([row(step, 0.0, 0.0, True) for step in range(1, 7)])  # cannot tell: nothing else seen
    assert len(lines) == 1 and "raise --sigma" in lines[0] and "saturated" not in lines[0]
    fell = [row(1, 500.0, 20.0, False)] + [row(step, 100.0, 100.0, True) for step in range(2, 8)]
    lines = warnings_of(fell)
    assert len(lines) == 1 and "raise --sigma" in lines[0]


def test_a_resumed_run_counts_the_rewards_its_rows_recorded():
    # metrics.csv's rows, as text: the run had climbed from 0.1 to 0.99 before its checkpoint
    resumed = [{"step": "1", "fitness_max": "0.5", "fitness_min": "0.1", "no_signal": "0"},
               {"step": "2", "fitness_max": "0.99", "fitness_min": "0.4", "no_signal": "0"}]
    lines = warnings_of([row(step, 0.99, 0.99, True) for step in range(3, 9)], resumed)
    assert len(lines) == 1 and "saturated" in lines[0] and "0.99" in lines[0]
