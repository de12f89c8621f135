"""EvoTorch side of benchmarks/control_vs_peers.py: one run of EvoTorch's own SNES / CMAES(separable=True) /
CMAES on a gymnasium environment through evotorch.neuroevolution.GymNE. Runs in .venv-evotorch (no nesgpu
import); control_vs_peers.py starts it and reads the JSON it writes.

The policy is the one every side uses: nn.Sequential(Linear(obs, hidden), Tanh, Linear(hidden, act)) followed
by high * tanh, no observation normalisation (GymNE's observation_normalization=False); GymNE flattens the
parameters in module order, the layout every side shares. One episode per member (num_episodes=1), GymNE's
own rollouts (one member after another, the env's own TimeLimit), no actors (num_actors=None: this process).

Run (normally by control_vs_peers.py):
  .venv-evotorch/bin/python benchmarks/control_vs_peers_evotorch.py --env Pendulum-v1 --algo snes --seed 0 \
      --generations 100 --population 32 --sigma 0.5 --hidden 16 --init init.json --out out.json
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from peer_run_args import peer_arguments  # noqa: E402  (this folder's)
from torch import nn  # noqa: E402

ALGOS = ("snes", "sep_cma_es", "cma_es")


class ScaledTanh(nn.Module):
    def __init__(self, high: float):
        super().__init__()
        self.high = high

    def forward(self, x):
        return self.high * torch.tanh(x)


def main() -> None:
    args = peer_arguments(__doc__.splitlines()[0], ALGOS, env=True)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    import gymnasium as gym
    from evotorch.algorithms import CMAES, SNES
    from evotorch.neuroevolution import GymNE

    probe = gym.make(args.env)
    obs_dim, act_dim = probe.observation_space.shape[0], probe.action_space.shape[0]
    high = float(np.max(np.abs(np.concatenate([probe.action_space.low, probe.action_space.high]))))
    probe.close()
    hidden = args.hidden

    def network():
        return nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, act_dim), ScaledTanh(high))

    with open(args.init) as f:
        init = torch.tensor(json.load(f)["init"], dtype=torch.float32)
    problem = GymNE(env=args.env, network=network, observation_normalization=False, num_episodes=1)
    assert problem.solution_length == init.numel(), (problem.solution_length, init.numel())
    if args.algo == "snes":
        searcher = SNES(problem, stdev_init=args.sigma, popsize=args.population, center_init=init)
    else:
        searcher = CMAES(problem, stdev_init=args.sigma, popsize=args.population, center_init=init,
                         separable=args.algo == "sep_cma_es")
    curve, seconds = [], []
    for _ in range(args.generations):
        t0 = time.perf_counter()
        searcher.step()
        seconds.append(time.perf_counter() - t0)
        curve.append(float(searcher.population.evals[:, 0].mean()))
    center = searcher.status["center"]
    result = {"library": "evotorch", "algo": args.algo, "seed": args.seed, "env": args.env,
              "final_mean": [float(x) for x in center.reshape(-1)], "first_generation_s": seconds[0],
              "generation_s": seconds[1:], "train_mean_return": curve,
              "versions": {k: importlib.metadata.version(k) for k in ("evotorch", "gymnasium", "torch")}}
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
