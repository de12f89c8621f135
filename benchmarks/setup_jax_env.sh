#!/usr/bin/env bash
# Make the JAX benchmark's own venv, .venv-jax at the repo root (git-ignored), for benchmarks/jax_pendulum.py.
# CPU-only JAX + evosax + gymnax. It never touches the project's .venv.
# Usage: bash benchmarks/setup_jax_env.sh        (re-running reuses the venv and re-applies the pins)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-jax

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip

# Pinned to a set that installs and runs together (Python 3.11, CPU):
#   evosax 0.3.x: new API, evosax.algorithms.Open_ES(population_size, solution=<pytree>) (0.1.x had OpenES)
#   gymnax 1.x: env.step returns 6 values (obs, state, reward, terminated, truncated, info)
#   six: gymnax 1.0.1 imports it (bsuite's MNIST loader) but does not declare it
"$VENV/bin/python" -m pip install -q \
    "jax[cpu]==0.10.2" "jaxlib==0.10.2" \
    "evosax==0.3.2" "gymnax==1.0.1" "flax==0.12.8" "optax==0.2.8" "six==1.17.0"

"$VENV/bin/python" - <<'EOF'
import importlib.metadata as m
import jax
print({n: m.version(n) for n in ("jax", "jaxlib", "evosax", "gymnax", "flax", "optax")}, "devices:", jax.devices())
EOF
