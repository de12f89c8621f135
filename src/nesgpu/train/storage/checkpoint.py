"""Atomic checkpoints: weights in safetensors, the rest in a weights-only torch file.

A checkpoint is a directory. It is written beside the old one and swapped in with renames, so a process
killed mid-save leaves the previous checkpoint intact (or, between the two renames, at ``<dir>.prev``,
where :func:`load_checkpoint` finds it).
"""

from __future__ import annotations

import errno
import importlib.util
import json
import math
import os
import pickle
import resource
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

from ...files import open_regular
from .tensor_file import batches, described, write_tensors

WEIGHTS, STATE = "model.safetensors", "state.pt"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write(path: Path, write) -> None:
    """``write(f)`` into a temporary binary file beside ``path``, then synced and renamed over it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600: run files are for everyone to read
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise explained(e, path) from e
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def require_safetensors() -> None:
    """The trainer writes and reads weights with safetensors (the ``[train]`` extra): a ValueError that says
    what to install where it is missing."""
    if importlib.util.find_spec("safetensors") is None:
        raise ValueError("the trainer saves the weights with safetensors, which is not installed: "
                         "pip install 'nesgpu[train]'")


TIED = "nesgpu_tied"  # metadata key: {name: the name whose tensor it shares} (tied weights are stored once)
MODEL_CLASS = "nesgpu_model_class"  # metadata key: the class of the model the weights were saved from


def class_name(model: nn.Module) -> str:
    """``model``'s class as ``module.QualifiedName``: what a weights file records it was saved from."""
    return f"{type(model).__module__}.{type(model).__qualname__}"


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    """The plain model's state (parameters and buffers) as safetensors, atomically, with string ``metadata``
    (a run's weights carry its configuration as JSON under "nesgpu_config"). A tensor shared by several names
    (tied embeddings: GPT-2's, Qwen2's, Gemma's) is stored once, under its first name; the metadata names the
    others, and :func:`load_weights` ties them again. Written tensor by tensor: no copy of the model in memory."""
    tensors, tied, seen = {}, {}, {}
    for name, value in model.state_dict().items():
        value = value.detach()
        key = (value.untyped_storage().data_ptr(), value.storage_offset(), value.shape, value.stride(), value.dtype)
        if value.numel() and key in seen:
            tied[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = value.contiguous()  # another view of a stored tensor (q/k/v of one engine weight) too
    meta = {**(metadata or {}), MODEL_CLASS: class_name(model)}
    if tied:
        meta[TIED] = json.dumps(tied)
    atomic_write(Path(path), lambda f: write_tensors(f, tensors, meta))


def load_weights(model: nn.Module, path: Path) -> dict[str, str]:
    """Load ``path`` into ``model``; returns the file's metadata. A tensor of another dtype than the model's is
    refused (load_state_dict would cast it: int32 into float, float into a binary layer's codes)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            metadata = f.metadata() or {}
            sources = _sources(model, path, f, metadata)
            if set(sources) == set(model.state_dict()):  # the model's own names: batch by batch, no second copy
                for batch in batches(f, list(sources), sources):
                    model.load_state_dict(batch, strict=False)
            else:  # other names (an older layout a module's own loading converts): whole, and strictly
                model.load_state_dict({name: f.get_tensor(source) for name, source in sources.items()})
    except ValueError:
        raise
    except RuntimeError as e:  # load_state_dict's report spans lines: one line of it
        raise ValueError(f"weights {path} do not match the model: {' '.join(str(e).split())}") from e
    except Exception as e:
        raise ValueError(f"cannot read weights {path}: the file is corrupt or not safetensors ({e})") from e
    return metadata


def _same_class(saved_from: str, cls: type) -> bool:
    """Whether ``saved_from`` (a file's ``module.QualifiedName``) names ``cls``. A script's class is
    ``__main__.Name`` when the script runs (``python own_defs.py``) and ``own_defs.Name`` when the script is
    loaded as a file or module (``--model own_defs.py:Name``): on either side ``__main__`` matches any module,
    the qualified name must still be the same."""
    if saved_from == f"{cls.__module__}.{cls.__qualname__}":
        return True
    if saved_from.startswith("__main__."):
        return saved_from[len("__main__."):] == cls.__qualname__
    return cls.__module__ == "__main__" and saved_from.endswith(f".{cls.__qualname__}")


def _sources(model: nn.Module, path: Path, f, metadata: dict) -> dict[str, str]:
    """Each name of the open file ``f`` (a tied name too) and the tensor it loads from (the one stored), once the
    dtypes and shapes of the names the model has are checked against the model's."""
    saved_from = metadata.get(MODEL_CLASS)  # older files did not say
    if saved_from is not None and not _same_class(saved_from, type(model)):  # same names, another network
        raise ValueError(f"weights {path} were saved from a {saved_from}; got a {class_name(model)} to load them into "
                         f"(pass the model class the run trained)")
    try:
        tied = json.loads(metadata.get(TIED, "{}"))
        stored = set(f.keys())
        sources = {name: name for name in stored} | {name: first for name, first in tied.items() if first in stored}
        if set(tied) - set(sources):
            raise KeyError(sorted(set(tied) - set(sources))[0])
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"cannot read weights {path}: its tied-weights record is damaged ({e})") from e
    own = model.state_dict()
    for name, source in sources.items():
        if name not in own:  # for the model's own loading to take or refuse (load_state_dict: strict)
            continue
        dtype, shape = described(f, source)
        if dtype != own[name].dtype:
            raise ValueError(f"weights {path} do not match the model's dtypes ({name}: {dtype} in the file, "
                             f"{own[name].dtype} in the model); they were saved by another model or configuration")
        if shape != tuple(own[name].shape):
            raise ValueError(f"weights {path} do not match the model: {name} has shape {shape} in the file, "
                             f"{tuple(own[name].shape)} in the model")
    return sources


def save_checkpoint(directory: Path, model: nn.Module, state: dict) -> None:
    """Write ``directory`` = {model.safetensors, state.pt}, replacing any previous one atomically."""
    def write(tmp: Path) -> None:
        save_weights(model, tmp / WEIGHTS)
        with open(tmp / STATE, "wb") as f:
            try:
                torch.save(state, f)
            except RuntimeError as e:  # torch's zip writer reports a full disk as "unexpected pos ..."
                raise write_failure(f, directory, e) from e
            f.flush()
            os.fsync(f.fileno())
    write_directory(directory, write)


def write_directory(directory: Path, write) -> None:
    """``write(tmp)`` fills a new directory beside ``directory``, which then replaces ``directory`` atomically
    (a failure leaves the old one as it was); its files are made 0644 and its directories 0755, as run files
    are (some writers, e.g. ``save_pretrained``, make 0600 temporary files)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    try:
        write(tmp)
        for path in (tmp, *tmp.rglob("*")):
            if not path.is_symlink():
                os.chmod(path, 0o755 if path.is_dir() else 0o644)
        prev = directory.with_name(directory.name + ".prev")
        if prev.exists():
            remove_old_copy(prev)
        if directory.exists():
            os.replace(directory, prev)
        os.replace(tmp, directory)
        shutil.rmtree(prev, ignore_errors=True)
        if prev.exists():
            warnings.warn(f"{prev}: the old copy of {directory.name} could not be removed (read-only?); remove "
                          f"it, or the next write of {directory} will stop on it", stacklevel=2)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_old_copy(prev: Path) -> None:
    """Remove the ``.prev`` copy an earlier :func:`write_directory` left (it could not remove it), or say
    which directory stops the write and what to do."""
    try:
        shutil.rmtree(prev)
    except OSError as e:
        raise OSError(e.errno, f"cannot remove {prev}, the old copy an earlier write left ({e.strerror}); make it "
                               f"writable (chmod -R u+w) or remove it, then run again", str(e.filename or prev)) from e


def explained(error: OSError, path: Path) -> OSError:
    """``error`` with the file it was writing, and for a file-size limit (``ulimit -f``) the limit."""
    if error.errno == errno.EFBIG:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            return OSError(errno.EFBIG, f"File too large: the process may write files of at most {limit} bytes "
                                        f"(ulimit -f)", str(path))
    return error if error.filename else OSError(error.errno, error.strerror, str(path))


def write_failure(f, directory: Path, error: RuntimeError) -> OSError:
    """What stopped torch.save writing into ``f`` (its zip writer only says "unexpected pos"): a file-size
    limit (``ulimit -f``), a full disk, or, when neither, the writer's own words."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and f.tell() >= limit - 64 * 1024:
        return explained(OSError(errno.EFBIG, os.strerror(errno.EFBIG)), directory)
    if shutil.disk_usage(directory.parent).free < 1024 * 1024:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
    return OSError(f"cannot write {directory} ({str(error).splitlines()[0]})")


def find_checkpoint(directory: Path) -> Path | None:
    directory = Path(directory)
    for candidate in (directory, directory.with_name(directory.name + ".prev")):
        if (candidate / WEIGHTS).is_file() and (candidate / STATE).is_file():
            return candidate
    return None


def load_checkpoint(directory: Path, model: nn.Module, validate=None) -> dict:
    """Read the state (with ``weights_only=True``), let ``validate(state)`` check it, then load the weights
    into ``model``. Returns the state."""
    found = find_checkpoint(directory)
    if found is None:
        raise ValueError(f"no checkpoint in {directory} (expected {WEIGHTS} and {STATE})")
    state = read_state(found / STATE)
    if validate is not None:
        validate(state)
    load_weights(model, found / WEIGHTS)
    return state


def read_state(path: Path) -> dict:
    """A checkpoint's ``state.pt``: read with ``weights_only=True`` (tensors and plain values only, never code),
    and a mapping; anything else is a ValueError that names the file (and never advises loading it unsafely)."""
    path = Path(path)
    with open_regular(path, "rb") as f:  # no size limit: a language model's Adam moments are its size, twice
        try:
            state = torch.load(f, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError:  # torch's message advises weights_only=False: code from a stranger
            raise ValueError(f"{path} is not a checkpoint nesgpu wrote: it holds objects other than tensors and "
                             f"plain values, which nesgpu never loads (they could run code); use a checkpoint of "
                             f"your own run") from None
        except Exception as e:
            first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            why = "" if "weights_only" in str(e) else f" ({first})"
            raise ValueError(f"cannot read {path}: the file is corrupt or not a nesgpu checkpoint{why}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}; expected the mapping of state nesgpu train writes "
                         f"(the file is damaged or not nesgpu's)")
    return state


def _json_safe(value):
    """NaN and infinities (not JSON) as null, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json(path: Path, values: dict) -> None:
    """``values`` as strict JSON (non-finite numbers become null), atomically."""
    atomic_write_text(Path(path), json.dumps(_json_safe(values), indent=2, allow_nan=False) + "\n")
