"""nesgpu: evolution strategies for PyTorch, with the whole population in one batched forward pass.

The public names (``convert``, ``PerturbedModel``, the perturbed layers, ...) load on first use, so the
``nesgpu`` command starts (and answers Ctrl-C) before torch is imported.
"""

import importlib

from .version import __version__  # noqa: F401 (nesgpu.__version__)

# public name -> the module that defines it (the perturbed layers come from nesgpu.layers' __all__)
_HOMES = {"PerturbedModel": "model", "convert": "conversion", "summary": "conversion", "export": "exporting",
          "check": "exactness", "CheckReport": "exactness"}


def _load_public() -> list[str]:
    """Import every public name into the package (once, at the first use of any): then the package is what an
    eager ``__init__`` would make it, for tools that read its ``__dict__`` (pdoc) too."""
    layers = importlib.import_module(".layers", __name__)
    names = {name: getattr(layers, name) for name in layers.__all__}
    names.update({name: getattr(importlib.import_module(f".{home}", __name__), name) for name, home in _HOMES.items()})
    names["kinds"] = importlib.import_module(".kinds", __name__)
    globals().update(names, __all__=sorted([*names, "load_run"]))
    return globals()["__all__"]


def __getattr__(name: str):
    if name.startswith("_") and name != "__all__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in (*_load_public(), "__all__"):  # loads them all: from here on they are plain attributes
        return globals()[name]
    try:  # a submodule: nesgpu.train, nesgpu.tasks, ...
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_load_public()})


def load_run(directory, device: str = "auto", model=None, task=None):
    """The trained model, task and config of a run directory (a run of your own model or task needs them
    again): see :func:`nesgpu.train.storage.runs.load_run` (needs the ``[train]`` extra)."""
    from .train.storage.runs import load_run as _load_run

    return _load_run(directory, device, model=model, task=task)
