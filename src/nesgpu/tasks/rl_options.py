"""The options of an RL task (the built-in environments and gym:<id>), and how a run settles them from the
run's strategy (by name): the observation clip it starts from, the policy output its strategy and hidden layers
call for, and whether observations are normalised. What RL runs of each strategy start from is RL's knowledge,
kept here in :data:`RL_PRESETS`, not the strategy's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..options import check_options, option
from .spec import MAX_COUNT

POLICY_OUTPUTS = ("tanh", "linear")
START_STATES = ("shared", "independent")


@dataclass(frozen=True)
class RLPreset:
    """How RL runs of one strategy start: the clip of standardised observations (0: none), and whether a policy
    without hidden layers acts linearly (the raw output, unbounded) rather than through tanh."""

    observation_clip: float = 5.0
    linear_policy: bool = False


RL_PRESETS: dict[str, RLPreset] = {
    "ars": RLPreset(observation_clip=0.0, linear_policy=True),  # the ARS paper: no clip, its linear policy
    # the strategies that adapt sigma per parameter or a covariance, raced on linear policies beside evosax and
    # EvoTorch
    **{name: RLPreset(linear_policy=True) for name in ("snes", "cem", "sep_cma_es", "cma_es", "xnes")},
}
"""Strategy name -> its :class:`RLPreset`; any other strategy (and backprop, None) starts from ``RLPreset()``."""


def preset(strategy: str | None) -> RLPreset:
    """The RL preset of the strategy named ``strategy`` (None: the gradient baseline, which clips as OpenAI-ES)."""
    return RL_PRESETS.get(strategy, RLPreset()) if strategy is not None else RLPreset()


def observation_statistics(strategy: str | None, strategy_options) -> bool:
    """Whether an RL run of ``strategy`` with ``strategy_options`` normalises observations by running statistics:
    yes, but for ARS V1 (the paper's raw observations)."""
    return not (strategy == "ars" and getattr(strategy_options, "ars_version", None) == "v1")


@dataclass(frozen=True)
class RLOptions:
    """The options of an RL task (the built-in environments and gym:<id>)."""

    episodes: int = option(1, "episodes (start states) per member per step", at_least=1, at_most=MAX_COUNT,
                           defines=True)
    eval_episodes: int = option(10, "episodes of each evaluation of the plain policy", at_least=1, at_most=MAX_COUNT)
    reward_shift: float = option(0.0, "subtracted from each training reward, not evaluations' (ARS's survival-"
                                      "bonus shift)", defines=True)
    start_states: str = option("shared", "shared (a step's rollouts start from the same states) or independent "
                                         "(as ARS)", choices=START_STATES, defines=True)
    policy_output: str = option("auto", "continuous actions: tanh or linear (as ARS); auto: linear for ars with "
                                        "--hidden 0",
                                choices=("auto", *POLICY_OUTPUTS), defines=True)
    observation_clip: float = option(5.0, "clip standardised observations to +-this; 0: none (default: 5; ars: "
                                          "none, as the paper)", at_least=0, defines=True)

    def __post_init__(self):
        check_options(self, "RL task")

    @staticmethod
    def run_defaults(strategy: str | None) -> dict:
        """The defaults a run's strategy (its name; None: the gradient baseline) sets: its preset's observation
        clip (ARS's paper: none)."""
        return {"observation_clip": preset(strategy).observation_clip}

    def for_run(self, strategy: str | None, hidden: tuple[int, ...]) -> RLOptions:
        """These options in a run of ``strategy`` (its name, or None) with ``hidden`` layers: policy_output
        auto is linear for a strategy whose preset has a linear policy (ARS) and no hidden layers, else tanh."""
        if self.policy_output != "auto":
            return self
        linear = preset(strategy).linear_policy and not hidden
        return dataclasses.replace(self, policy_output="linear" if linear else "tanh")

    def task_arguments(self) -> dict:
        """What :class:`RLTask` takes of these options (auto: tanh, for a task built outside a run; a clip of
        0: none)."""
        output = "tanh" if self.policy_output == "auto" else self.policy_output
        return dict(episodes=self.episodes, eval_episodes=self.eval_episodes, reward_shift=self.reward_shift,
                    start_states=self.start_states, policy_output=output,
                    observation_clip=self.observation_clip or None)


__all__ = ["POLICY_OUTPUTS", "RLOptions", "RLPreset", "RL_PRESETS", "START_STATES", "observation_statistics", "preset"]
