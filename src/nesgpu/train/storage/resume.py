"""Resuming a run: the checkpoint must be this run's (the options that define it unchanged), then the
step object's state is restored and the options a resume may change take effect from the next step."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ...strategies import Schedule
from ...tasks.protocol import Fingerprinted
from ..loop import Progress
from ..setup.config import TrainConfig
from ..setup.old_runs import recorded, warn_unfingerprinted
from ..steps.evolution import Stepper
from . import rundir
from .checkpoint import STATE, WEIGHTS, find_checkpoint, load_checkpoint


def resume(cfg: TrainConfig, out: Path, stepper: Stepper, supervised: bool, log, task=None) -> Progress:
    """Load ``out``'s last checkpoint into ``stepper`` and its model; returns the run's progress so far.
    ``supervised`` says which defaults an older run had (:func:`~nesgpu.train.setup.old_runs.recorded`); a
    ``task`` whose data the checkpoint fingerprinted must hold the same data."""
    new = cfg.to_dict()

    def check(state):
        old = recorded(checked_record(state, out), out, cfg.strategy, cfg.task, supervised)
        if old.get("task") != cfg.task:
            raise ValueError(f"checkpoint in {out} is for task {old.get('task')!r}, not {cfg.task!r}")
        changed = rundir.differences(old, new, rundir.defining())
        if changed:
            raise ValueError(f"cannot resume {out}: options that define the run differ from its checkpoint "
                             f"({'; '.join(changed)}); start a new run to change them")
        check_data(state, task, out)
        at = checked_strategy(state, out)["step"]
        if cfg.steps < at:
            raise ValueError(f"--steps {cfg.steps} is below the checkpoint's step {at}; expected >= {at}")

    if find_checkpoint(out / "checkpoint") is None:
        raise ValueError(f"cannot resume {out}: it holds no checkpoint ({out / 'checkpoint'} with {WEIGHTS} and "
                         f"{STATE}): the run stopped before its first one; start it again: nesgpu train --config "
                         f"{out / 'config.json'} --out {out} --overwrite{rundir.moved_aside(out)}")
    state = load_checkpoint(out / "checkpoint", stepper.model, validate=check)
    try:
        stepper.load_state_dict(state["strategy"])
    except (KeyError, ValueError, RuntimeError, TypeError, AttributeError, IndexError) as e:
        raise ValueError(f"checkpoint in {out} does not match this configuration: {' '.join(str(e).split())}") from e
    old = recorded(state["config"], out, cfg.strategy, cfg.task)
    stepper.apply_changes(old, cfg)
    # a new schedule (or a new --steps, which stretches one) applies from the next step: say where it jumps
    jumps = [f"{name} {before:.4g} -> {after:.4g}" for name, before, after in scheduled_values(old, cfg, stepper.step)
             if not math.isclose(before, after, rel_tol=1e-9)]
    kept = [n for n in rundir.option_names(new) if n not in rundir.defining() and n != "out"]
    changed = rundir.differences(old, new, kept)
    every = [max(1, int(steps or 1) // 10) for steps in (old.get("steps"), cfg.steps)]  # eval_every 0: a tenth
    if not cfg.eval_every and not old.get("eval_every") and every[0] != every[1]:
        changed.append(f"evaluations every {every[1]} steps, a tenth of --steps (were every {every[0]}: the rows that "
                       f"evaluate differ from an uninterrupted run's, the weights do not)")
    log(f"resuming {out} at step {stepper.step} of {cfg.steps}"
        + (f"; from step {stepper.step + 1}: {'; '.join(changed)}" if changed else "")
        + (f" (at that step {', '.join(jumps)})" if jumps else ""))
    elapsed = float(state["seconds"])
    stopped, value = state.get("stopped") or (None, None)  # an older checkpoint did not say
    return Progress(elapsed=elapsed, env_steps=int(state["env_steps"]), last_checkpoint=stepper.step,
                    last_eval=elapsed, stopped=stopped, stopped_value=value)


def checked_record(state: dict, out: Path) -> dict:
    """A checkpoint's record of its run (config, seconds, env_steps, why it stopped) as nesgpu train writes it;
    returns the config. A ValueError names what is not."""
    damaged = "(the file is damaged or not nesgpu's)"
    config = state.get("config", {})
    if not isinstance(config, dict):
        raise ValueError(f"checkpoint in {out}: its config is a {type(config).__name__}; expected a mapping of "
                         f"options {damaged}")
    for key in ("seconds", "env_steps"):
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"checkpoint in {out}: its {key} is {value!r:.40}; expected a number >= 0 {damaged}")
    stopped = state.get("stopped")
    if stopped is not None and not (isinstance(stopped, (list, tuple)) and len(stopped) == 2):
        raise ValueError(f"checkpoint in {out}: its stopped is {stopped!r:.40}; expected [why, value] {damaged}")
    return config


def check_data(state: dict, task, out: Path) -> None:
    """Refuse to resume on data other than the run's (a prompts file edited since): a ValueError."""
    recorded = state.get("data") if isinstance(state, dict) else None
    if recorded is None:
        warn_unfingerprinted(task, out)
        return
    if not isinstance(task, Fingerprinted):
        return
    now = task.data_fingerprint()
    if now != recorded:
        raise ValueError(f"cannot resume {out}: the task's data (its prompts and their other columns) differ "
                         f"from what the run trained on (fingerprint {recorded}, now {now}); restore that data, or "
                         f"start a new run on this one")


def checked_strategy(state: dict, out: Path) -> dict:
    """A checkpoint's strategy state, refused (a ValueError) when it is missing, its step is not a whole
    number >= 0, or its optimizer state holds NaN or infinity (a run resumed from it could only diverge)."""
    strategy = state.get("strategy") if isinstance(state, dict) else None
    if not isinstance(strategy, dict):
        raise ValueError(f"checkpoint in {out} has no strategy state: nesgpu train did not write it, or it is "
                         f"damaged")
    at = strategy.setdefault("step", 0)
    if isinstance(at, bool) or not isinstance(at, int) or at < 0:
        raise ValueError(f"checkpoint in {out} is at step {at!r}; expected a whole number >= 0 (the file is damaged)")
    bad = [name for name, value in _tensors(strategy.get("optimizer"), "optimizer")
           if value.is_floating_point() and not bool(torch.isfinite(value).all())]
    if bad:
        raise ValueError(f"checkpoint in {out}: its optimizer state holds NaN or infinite values ({bad[0]}); it "
                         f"cannot be resumed; start a new run")
    return strategy


def _tensors(value, name: str):
    """(path, tensor) of every tensor in a nested state of dicts and lists."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{name}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{name}[{i}]")


def scheduled_values(old: dict, cfg: TrainConfig, step: int) -> list[tuple[str, float, float]]:
    """(name, value under the checkpoint's schedule, value under the new one) of sigma's and lr's factor at
    ``step``, for schedules that are not constant in either run."""
    values = []
    for name in ("lr", "sigma"):
        kinds = (old.get(f"{name}_schedule") or "constant", getattr(cfg, f"{name}_schedule"))
        if kinds == ("constant", "constant"):
            continue
        final = old.get(f"{name}_final")
        before = Schedule(kinds[0], 1.0 if final is None else final, max(1, int(old.get("steps") or 1)))(step)
        after = Schedule(kinds[1], getattr(cfg, f"{name}_final"), cfg.steps)(step)
        values.append((f"{name} factor", before, after))
    return values


__all__ = ["resume", "scheduled_values"]
