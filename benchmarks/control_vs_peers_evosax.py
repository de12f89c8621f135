"""evosax side of benchmarks/control_vs_peers.py: one run of evosax's own SNES / Sep_CMA_ES / CMA_ES on gymnax's
Pendulum-v1. Runs in .venv-jax (no nesgpu import); control_vs_peers.py starts it and reads the JSON it writes.

The policy is the one every side uses: a flat parameter vector in torch's nn.Linear layout
[W1 (hidden x obs, row-major), b1, W2 (act x hidden), b2], action = high * tanh(W2 tanh(W1 obs + b1) + b2),
no observation normalisation. One generation = ask + one 200-step episode per member (its own reset key:
independent start states) + tell, jitted as one program. evosax minimises: it is told the negated returns.

Run (normally by control_vs_peers.py):
  .venv-jax/bin/python benchmarks/control_vs_peers_evosax.py --algo snes --seed 0 --generations 100 \
      --population 32 --sigma 0.5 --hidden 16 --init init.json --out out.json
"""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import gymnax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from evosax.algorithms import CMA_ES, SNES, Sep_CMA_ES  # noqa: E402
from peer_run_args import peer_arguments  # noqa: E402  (this folder's)

ALGOS = {"snes": SNES, "sep_cma_es": Sep_CMA_ES, "cma_es": CMA_ES}


def main() -> None:
    args = peer_arguments(__doc__.splitlines()[0], ALGOS)

    env, env_params = gymnax.make("Pendulum-v1")
    obs_dim, act_dim, high, horizon, hidden = 3, 1, 2.0, 200, args.hidden
    with open(args.init) as f:
        init = jnp.asarray(json.load(f)["init"], dtype=jnp.float32)
    n = init.shape[0]
    assert n == hidden * obs_dim + hidden + act_dim * hidden + act_dim, (n, hidden)

    def act(flat, obs):
        i = 0
        w1 = flat[i:i + hidden * obs_dim].reshape(hidden, obs_dim); i += hidden * obs_dim
        b1 = flat[i:i + hidden]; i += hidden
        w2 = flat[i:i + act_dim * hidden].reshape(act_dim, hidden); i += act_dim * hidden
        b2 = flat[i:i + act_dim]
        return high * jnp.tanh(w2 @ jnp.tanh(w1 @ obs + b1) + b2)

    def episode(flat, key):
        key_reset, key_steps = jax.random.split(key)
        obs, state = env.reset(key_reset, env_params)

        def body(carry, k):
            obs, state = carry
            obs, state, reward, _, _, _ = env.step(k, state, act(flat, obs), env_params)
            return (obs, state), reward  # Pendulum never terminates before its 200-step limit

        _, rewards = jax.lax.scan(body, (obs, state), jax.random.split(key_steps, horizon))
        return rewards.sum()

    strategy = ALGOS[args.algo](population_size=args.population, solution=init)
    params = strategy.default_params.replace(std_init=args.sigma)

    @jax.jit
    def generation(key, state):
        key_ask, key_eval, key_tell = jax.random.split(key, 3)
        population, state = strategy.ask(key_ask, state, params)
        returns = jax.vmap(episode)(population, jax.random.split(key_eval, args.population))
        state, _ = strategy.tell(key_tell, population, -returns, state, params)
        return state, returns.mean()

    key = jax.random.key(args.seed)
    key, key_init = jax.random.split(key)
    state = strategy.init(key_init, init, params)
    curve, seconds = [], []
    for _ in range(args.generations):
        key, k = jax.random.split(key)
        t0 = time.perf_counter()
        state, mean_return = generation(k, state)
        mean_return = float(mean_return)  # blocks until the generation is done
        seconds.append(time.perf_counter() - t0)
        curve.append(mean_return)
    result = {"library": "evosax", "algo": args.algo, "seed": args.seed, "final_mean": [float(x) for x in state.mean],
              "first_generation_s": seconds[0], "generation_s": seconds[1:], "train_mean_return": curve,
              "versions": {"evosax": __import__("importlib.metadata").metadata.version("evosax"),
                           "gymnax": __import__("importlib.metadata").metadata.version("gymnax"),
                           "jax": jax.__version__}}
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
