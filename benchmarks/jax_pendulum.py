"""Pendulum-v1 throughput, JAX side: OpenAI-ES (evosax) on gymnax's Pendulum, the whole ES loop jitted.

One generation = ask + one 200-step episode per member (vmap over members, lax.scan over steps) + tell,
compiled as a single XLA program. Policy: MLP obs(3) -> hidden (tanh) -> 1, action = 2 * tanh(out)
(nesgpu's Policy for a continuous action in [-2, 2], without its observation normalisation).
Measured: env steps per second (population * 200 per generation, Pendulum never ends early) over
`--generations` generations after one warm-up generation; compile time is reported apart.

Setup: bash benchmarks/setup_jax_env.sh   (makes .venv-jax; never touches .venv)
Run:   .venv-jax/bin/python benchmarks/jax_pendulum.py --population 256 --hidden 64 --generations 50 --rounds 3
Prints one JSON line. No nesgpu import: this runs in its own venv.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import time

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--population", type=int, default=256)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--generations", type=int, default=50, help="timed generations per round")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--steps", type=int, default=200, help="episode length (gymnax Pendulum's limit is 200)")
p.add_argument("--sigma", type=float, default=0.1)
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--threads", type=int, default=0, help="XLA CPU threads; 0 = XLA's default (all cores)")
p.add_argument("--no-autoreset", action="store_true",
               help="call env.step_env (no auto-reset branch) instead of env.step")
args = p.parse_args()

if args.threads:  # must be set before jax is imported
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen="
                               + ("false" if args.threads == 1 else "true")
                               + f" intra_op_parallelism_threads={args.threads}").strip()

import evosax  # noqa: E402
import gymnax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from evosax.algorithms import Open_ES  # noqa: E402

env, env_params = gymnax.make("Pendulum-v1")
ACTION_HIGH = 2.0  # Pendulum's max torque


def init_policy(key, obs_dim=3, hidden=args.hidden, out=1):
    """PyTorch nn.Linear's default init (uniform +-1/sqrt(fan_in)); a pytree that evosax ravels to flat."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    b1, b2 = 1 / obs_dim ** 0.5, 1 / hidden ** 0.5
    u = jax.random.uniform
    return {"w1": u(k1, (obs_dim, hidden), minval=-b1, maxval=b1), "b1": u(k2, (hidden,), minval=-b1, maxval=b1),
            "w2": u(k3, (hidden, out), minval=-b2, maxval=b2), "b2": u(k4, (out,), minval=-b2, maxval=b2)}


def policy(params, obs):
    h = jnp.tanh(obs @ params["w1"] + params["b1"])
    return ACTION_HIGH * jnp.tanh(h @ params["w2"] + params["b2"])


def episode_return(params, key):
    """One episode of `args.steps` steps for one member (vmapped over the population)."""
    key_reset, key_steps = jax.random.split(key)
    obs, state = env.reset(key_reset, env_params)

    def step(carry, k):
        obs, state, ret = carry
        action = policy(params, obs)
        # gymnax 1.x: step -> (obs, state, reward, terminated, truncated, info); step_env -> 5 values
        obs, state, reward, *_ = (env.step_env if args.no_autoreset else env.step)(k, state, action, env_params)
        return (obs, state, ret + reward), None

    (_, _, ret), _ = jax.lax.scan(step, (obs, state, 0.0), jax.random.split(key_steps, args.steps))
    return ret


key = jax.random.key(args.seed)
key, k_init, k_es = jax.random.split(key, 3)
mean0 = init_policy(k_init)  # evosax ravels this pytree: the search runs on a flat vector
es = Open_ES(population_size=args.population, solution=mean0, optimizer=optax.adam(args.lr),
             std_schedule=optax.constant_schedule(args.sigma))
es_params = es.default_params
num_params = es.num_dims


@jax.jit
def generation(es_state, key):
    """ask -> rollouts of the whole population -> tell, as one XLA program."""
    key, k_ask, k_eval, k_tell = jax.random.split(key, 4)
    population, es_state = es.ask(k_ask, es_state, es_params)  # pytree, leading axis = population
    returns = jax.vmap(episode_return)(population, jax.random.split(k_eval, args.population))
    es_state, _ = es.tell(k_tell, population, -returns, es_state, es_params)  # evosax minimises
    return es_state, key, returns.mean()


es_state = es.init(k_es, mean0, es_params)
t0 = time.perf_counter()
compiled = generation.lower(es_state, key).compile()  # trace + lower + XLA compile
compile_s = time.perf_counter() - t0

steps_per_gen = args.population * args.steps
rounds, mean_returns = [], []
for _ in range(args.rounds):
    es_state, key, r = compiled(es_state, key)  # warm-up generation (not timed)
    jax.block_until_ready(r)
    t0 = time.perf_counter()
    for _ in range(args.generations):
        es_state, key, r = compiled(es_state, key)
    jax.block_until_ready((es_state, r))
    rounds.append(steps_per_gen * args.generations / (time.perf_counter() - t0))
    mean_returns.append(float(r))  # sanity: the population's mean return at the end of the round

print(json.dumps({
    "framework": "evosax+gymnax",
    "versions": {name: importlib.metadata.version(name) for name in ("jax", "jaxlib", "evosax", "gymnax", "flax", "optax")},
    "population": args.population, "hidden": args.hidden, "num_params": num_params,
    "episode_steps": args.steps, "generations": args.generations, "autoreset": not args.no_autoreset,
    "env_steps_per_s": statistics.median(rounds), "rounds": rounds, "compile_s": compile_s,
    "mean_return_after_round": mean_returns,
    "threads": args.threads or len(os.sched_getaffinity(0)), "device": str(jax.devices()[0]),
}))
