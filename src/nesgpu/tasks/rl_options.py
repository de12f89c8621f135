"""The options of an RL task (the built-in environments and gym:<id>), and how a run settles them: the
strategy's observation clip, and the policy output its strategy and hidden layers call for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..options import check_options, option
from .spec import MAX_COUNT

POLICY_OUTPUTS = ("tanh", "linear")
START_STATES = ("shared", "independent")


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
    def run_defaults(strategy) -> dict:
        """The defaults a run's strategy (its class; None: the gradient baseline, which clips as OpenAI-ES)
        sets: its observation clip (ARS's paper: none)."""
        return {"observation_clip": strategy.observation_clip if strategy is not None else 5.0}

    def for_run(self, strategy, hidden: tuple[int, ...]) -> RLOptions:
        """These options in a run of ``strategy`` (its class, or None) with ``hidden`` layers: policy_output
        auto is linear for a strategy with a linear policy (ARS) and no hidden layers, else tanh."""
        if self.policy_output != "auto":
            return self
        linear = strategy is not None and strategy.linear_policy and not hidden
        return dataclasses.replace(self, policy_output="linear" if linear else "tanh")

    def task_arguments(self) -> dict:
        """What :class:`RLTask` takes of these options (auto: tanh, for a task built outside a run; a clip of
        0: none)."""
        output = "tanh" if self.policy_output == "auto" else self.policy_output
        return dict(episodes=self.episodes, eval_episodes=self.eval_episodes, reward_shift=self.reward_shift,
                    start_states=self.start_states, policy_output=output,
                    observation_clip=self.observation_clip or None)


__all__ = ["POLICY_OUTPUTS", "RLOptions", "START_STATES"]
