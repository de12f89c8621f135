"""``nesgpu tune``: Bayesian search over ``nesgpu train`` options with Optuna (needs the ``[tune]`` extra).

Example:
    >>> from nesgpu.train import TrainConfig
    >>> from nesgpu.tune import tune
    >>> study = tune(TrainConfig(task="cartpole", steps=30), {"lr": {"low": 0.01, "high": 1.0, "log": True}},
    ...              trials=10, out="tune/cartpole")
    >>> study.best_params

Modules: :mod:`.space` (the search-space format, its checks, the default spaces), :mod:`.study` (the
trial loop, pruning, samplers), :mod:`.storage` (``study.db``, locking, heartbeats, resuming),
:mod:`.outputs` (trials.csv, best.yaml, plots), :mod:`.cli` (the command).

Without Optuna installed the package still loads (``nesgpu`` registers the command); :func:`tune` then
raises an ImportError saying what to install.
"""

# re-exported through __all__ (computed below: without Optuna only what loads without it)
from .space import DEFAULT_SPACES, SearchSpace, default_space, make_space, parse_space, read_space  # noqa: F401

try:
    from .outputs import best_config, summary  # noqa: F401
    from .study import PRUNERS, SAMPLERS, tune  # noqa: F401
except ImportError as e:  # Optuna is optional: only the search itself needs it
    if (e.name or "").split(".")[0] != "optuna":
        raise
    _MISSING = str(e)

    def tune(*args, **kwargs):
        """Stands in for :func:`nesgpu.tune.study.tune` when Optuna is not installed."""
        raise ImportError(f"nesgpu tune needs Optuna ({_MISSING}); pip install 'nesgpu[tune]'")

__all__ = [name for name in ("DEFAULT_SPACES", "PRUNERS", "SAMPLERS", "SearchSpace", "best_config", "default_space",
                             "make_space", "parse_space", "read_space", "summary", "tune") if name in globals()]
