"""Classic-control environments in torch, batched over rows."""

from .acrobot import Acrobot
from .base import TorchEnv
from .cartpole import CartPole
from .mountaincar import MountainCarContinuous
from .pendulum import Pendulum

ENVS: dict[str, type[TorchEnv]] = {
    "cartpole": CartPole, "pendulum": Pendulum, "acrobot": Acrobot, "mountaincar": MountainCarContinuous,
}

__all__ = ["ENVS", "Acrobot", "CartPole", "MountainCarContinuous", "Pendulum", "TorchEnv"]
