"""``--preset ars-paper``: the ARS paper's settings for the MuJoCo locomotion tasks (Mania, Guy & Recht 2018,
"Simple random search provides a competitive approach to reinforcement learning", ARS V2-t).

Per environment: step size alpha, directions N, top directions b, noise nu, the survival-bonus shift, and
the reward threshold of the paper's Table 1. The preset also sets what the paper's algorithm does: a
linear policy (no hidden layer, no bias, zero start, actions not squashed), full Gaussian directions,
observation statistics without clipping, every rollout from its own start state, one episode per
member, and an evaluation of the mean policy over 100 episodes every 10 steps. The environments are
gymnasium's v5 (the paper used v1 on MuJoCo 1.31), so the thresholds compare approximately.
"""

from __future__ import annotations

# env name -> (alpha, N, b, nu, shift, threshold, steps); steps: a cap, the target stops a run earlier
ARS_PAPER: dict[str, tuple[float, int, int, float, float, float, int]] = {
    "HalfCheetah": (0.02, 32, 4, 0.03, 0.0, 3430.0, 300),
    "Hopper": (0.01, 8, 4, 0.025, 1.0, 3120.0, 1000),
    "Walker2d": (0.03, 40, 30, 0.025, 1.0, 4390.0, 1500),
    "Ant": (0.015, 60, 20, 0.025, 1.0, 3580.0, 1500),
    "Humanoid": (0.02, 230, 230, 0.0075, 5.0, 6000.0, 1500),
}
PRESETS = ("ars-paper",)


def env_name(task: str) -> str:
    """"gym:Hopper-v5" -> "Hopper"."""
    return task[4:].split("-")[0] if task.startswith("gym:") else task


def preset_values(preset: str, task: str) -> dict:
    """The options ``preset`` sets for ``task``; a ValueError names the tasks it knows."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {list(PRESETS)}; got {preset!r}")
    name = env_name(task)
    if name not in ARS_PAPER:
        raise ValueError(f"preset 'ars-paper' knows the MuJoCo tasks {[f'gym:{n}-v5' for n in ARS_PAPER]}; "
                         f"got task {task!r}")
    alpha, n, b, nu, shift, threshold, steps = ARS_PAPER[name]
    return dict(strategy="ars", ars_version="v2", layer="gaussian", hidden=(), episodes=1, population=2 * n,
                top_b=b, sigma=nu, lr=alpha, reward_shift=shift, target=threshold, steps=steps, eval_every=10,
                eval_episodes=100, start_states="independent", policy_output="linear", observation_clip=0.0)
