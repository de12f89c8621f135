"""The command line of one peer run of benchmarks/control_vs_peers.py (control_vs_peers_evosax.py and
control_vs_peers_evotorch.py): standard library only, as those scripts run in the peers' own venvs."""

from __future__ import annotations

import argparse


def peer_arguments(description: str, algos, env: bool = False) -> argparse.Namespace:
    """The arguments every peer run takes: the algorithm, its budget and sigma, the policy's hidden size, the
    initial mean's JSON file and the output file (and, with ``env``, the environment's id)."""
    p = argparse.ArgumentParser(description=description)
    if env:
        p.add_argument("--env", required=True)
    p.add_argument("--algo", choices=sorted(algos), required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--generations", type=int, default=100)
    p.add_argument("--population", type=int, default=32)
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--init", required=True, help="JSON file with the flat initial mean ('init')")
    p.add_argument("--out", required=True)
    return p.parse_args()
