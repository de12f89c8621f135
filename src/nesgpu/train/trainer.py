"""The training loop: ask, evaluate the population, tell; record, checkpoint, resume."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from ..model import PerturbedModel, convert
from ..strategies import ARS, PGPE, OpenAIES, Schedule, Strategy
from ..tasks import make_task
from .checkpoint import load_checkpoint, load_weights, save_checkpoint, save_weights, write_json
from .config import TrainConfig
from .metrics import MetricsLog, plot_curve


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested, but CUDA is not available")
    return device


def build(cfg: TrainConfig, device: torch.device):
    """Task, plain model (converted to the perturbed kind), PerturbedModel and strategy of a config."""
    task = make_task(cfg.task, device=device, seed=cfg.seed, batch_size=cfg.batch_size, episodes=cfg.episodes,
                     eval_episodes=cfg.eval_episodes)
    with torch.random.fork_rng(devices=[]):  # seeded initialisation that leaves the caller's RNG alone
        torch.manual_seed(cfg.seed)
        model = task.make_model(cfg.hidden)
    model = convert(model, cfg.layer, **cfg.layer_options).to(device)
    pm = PerturbedModel(model, cfg.directions, sigma=cfg.sigma, antithetic=cfg.antithetic, seed=cfg.seed)
    schedules = dict(
        sigma_schedule=None if cfg.sigma_schedule == "constant" else Schedule(cfg.sigma_schedule, cfg.sigma_final,
                                                                              cfg.steps),
        lr_schedule=None if cfg.lr_schedule == "constant" else Schedule(cfg.lr_schedule, cfg.lr_final, cfg.steps))
    if cfg.strategy == "openai_es":
        strategy: Strategy = OpenAIES(pm, lr=cfg.lr, shaping=cfg.shaping, weight_decay=cfg.weight_decay, **schedules)
    elif cfg.strategy == "ars":
        strategy = ARS(pm, lr=cfg.lr, top_b=cfg.top_b, version=cfg.ars_version, **schedules)
    else:
        strategy = PGPE(pm, lr=cfg.lr, shaping=cfg.shaping, **schedules)
    if hasattr(task, "normalize_observations"):
        task.normalize_observations = strategy.normalize_observations
    return task, model, pm, strategy


def _progress(total: int, initial: int):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with the train extra
        return None
    return tqdm(total=total, initial=initial, disable=not sys.stderr.isatty(), unit="step", dynamic_ncols=True)


def train(cfg: TrainConfig, resume: bool = False, log=print) -> dict:
    """Run (or resume) a training run; returns the summary written to ``summary.json``."""
    cfg = cfg.resolved()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    task, model, pm, strategy = build(cfg, device)
    elapsed, env_steps = 0.0, 0
    if resume:
        def same_task(state):
            task = state.get("config", {}).get("task") if isinstance(state, dict) else None
            if task != cfg.task:
                raise ValueError(f"checkpoint in {out} is for task {task!r}, not {cfg.task!r}")

        state = load_checkpoint(out / "checkpoint", model, validate=same_task)
        try:
            strategy.load_state_dict(state["strategy"])
        except (KeyError, ValueError, RuntimeError) as e:
            raise ValueError(f"checkpoint in {out} does not match this configuration: {e}") from e
        elapsed, env_steps = float(state["seconds"]), int(state["env_steps"])
        log(f"resuming {out} at step {strategy.step} of {cfg.steps}")
    write_json(out / "config.json", json.loads(cfg.to_json()))
    metrics = MetricsLog(out, resume_step=strategy.step if resume else 0)
    eval_every = cfg.eval_every or max(1, cfg.steps // 10)
    checkpoint_every = cfg.checkpoint_every or max(1, cfg.steps // 10)

    def checkpoint():
        save_checkpoint(out / "checkpoint", model, {
            "strategy": strategy.state_dict(), "seconds": elapsed, "env_steps": env_steps,
            "config": dataclasses.asdict(cfg)})

    bar = _progress(cfg.steps, strategy.step)
    start = time.perf_counter() - elapsed
    try:
        while strategy.step < cfg.steps:
            step = strategy.step + 1
            strategy.ask()
            fitness, info = task.fitness(pm, step)
            stats = strategy.tell(fitness)
            env_steps += int(info.get("env_steps", 0))
            elapsed = time.perf_counter() - start
            row = {"step": step, "seconds": elapsed, "env_steps": env_steps, **stats,
                   **{k: float(v) for k, v in info.items() if k != "env_steps"}}
            if step % eval_every == 0 or step == cfg.steps:
                row[task.metric] = task.evaluate(model)
            metrics.write(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix({k: f"{row[k]:.4g}" for k in ("fitness_mean", task.metric) if k in row})
            if step % checkpoint_every == 0 or step == cfg.steps:
                checkpoint()
    finally:
        if bar is not None:
            bar.close()
        metrics.close()
    pm.free_memory()
    value = task.evaluate(model)
    save_weights(model, out / "model.safetensors")
    plot_curve(metrics.rows, task.metric, out / "curve.png", f"{cfg.task}: {cfg.strategy}, {cfg.layer}")
    summary = {"task": cfg.task, "metric": task.metric, "value": value, "steps": cfg.steps,
               "seconds": round(elapsed, 3), "env_steps": env_steps, "strategy": cfg.strategy, "layer": cfg.layer,
               "population": cfg.population, "sigma": pm.sigma, "lr": cfg.lr, "seed": cfg.seed,
               "device": str(device)}
    write_json(out / "summary.json", summary)
    log(f"{cfg.task}: {task.metric} = {value:.4f} after {cfg.steps} steps in {elapsed:.1f} s -> {out}")
    return summary


def evaluate_run(directory: str | Path, device: str = "auto") -> dict:
    """Rebuild a run's model from ``config.json`` and ``model.safetensors`` and evaluate it."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory} is not a run directory (no config.json)")
    cfg = TrainConfig.from_dict(json.loads(config_path.read_text()), source=str(config_path)).resolved()
    cfg.device = device
    task, model, _, _ = build(cfg, resolve_device(device))
    load_weights(model, directory / "model.safetensors")
    return {"task": cfg.task, "metric": task.metric, "value": task.evaluate(model), "run": str(directory)}


__all__ = ["TrainConfig", "build", "evaluate_run", "resolve_device", "train"]
