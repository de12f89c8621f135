"""The command-line front ends of training: ``nesgpu train`` and ``nesgpu eval`` (their flags generated from
``TrainConfig``), ``nesgpu play`` (a trained RL policy, optionally filmed) and ``nesgpu compare`` (ES and
backprop under one budget)."""

from .play import play_run

__all__ = ["play_run"]
