"""Reinforcement learning as an ES task: every row of the population runs its own episode, all at once."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..model import PerturbedModel
from ..noise import derive_seed
from .envs.base import TorchEnv
from .rl_options import POLICY_OUTPUTS, START_STATES

_ENV_STREAM = 0x656E76  # keys environment resets apart from the noise
EVAL_STREAM = 0x6576616C  # keys evaluation episodes apart (the trainer's and nesgpu play's)


class _Affine(NamedTuple):
    """The statistics tensors an affine map was computed from, their state (``key``) and the map."""

    mean: torch.Tensor
    var: torch.Tensor
    key: tuple
    affine: tuple[torch.Tensor, torch.Tensor]


class ObservationNorm(nn.Module):
    """Running mean / variance of observations (buffers, so the saved plain model carries them).

    ``forward`` standardises and clips to [-clip, clip] (``clip=None``: no clipping, as ARS). A feature whose
    variance is below 1e-14 (constant so far) is set to 0 rather than blown up. ``update`` merges batch
    statistics (Chan et al.).
    """

    def __init__(self, dim: int, clip: float | None = 5.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, inv_std = self._affine(x.dtype)
        z = (x - mean) * inv_std
        return z if self.clip is None else z.clamp(-self.clip, self.clip)

    def _affine(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, 1 / std) in ``dtype``, recomputed only when the buffers change (an update, a state-dict
        load or a move): a rollout calls forward at every environment step."""
        def compute():
            inv_std = torch.where(self.var < 1e-14, 0.0, (self.var + self.eps).rsqrt())
            return self.mean.to(dtype), inv_std.to(dtype)

        mean, var = self.mean, self.var
        if torch.compiler.is_compiling() or mean.is_inference() or var.is_inference():  # compiled code fuses
            return compute()  # these few ops itself; inference tensors have no version counters to watch
        # the same tensor objects (held here, so never recycled), unmodified since (version counters; the
        # storage pointers catch a `.data = ...` swap, which the counters do not see)
        key = (dtype, mean._version, var._version, mean.data_ptr(), var.data_ptr())
        cached = getattr(self, "_cached_affine", None)
        if cached is None or cached.mean is not mean or cached.var is not var or cached.key != key:
            cached = self._cached_affine = _Affine(mean, var, key, compute())
        return cached.affine

    @torch.no_grad()
    def update(self, total: torch.Tensor, total_sq: torch.Tensor, count: torch.Tensor) -> None:
        """Merge a batch given by its sum, sum of squares and count (all float64). No host sync."""
        mean_b = total / count.clamp_min(1)
        var_b = (total_sq / count.clamp_min(1) - mean_b.square()).clamp_min(0)
        n = self.count + count
        delta = mean_b - self.mean
        self.mean += delta * count / n.clamp_min(1)
        merged = (self.var * self.count + var_b * count + delta.square() * self.count * count / n.clamp_min(1))
        self.var.copy_(torch.where(n > 0, merged / n.clamp_min(1), self.var))  # an empty batch changes nothing
        self.count.copy_(n)




class Policy(nn.Module):
    """obs -> [ObservationNorm] -> MLP (tanh) -> action. Discrete: argmax; continuous: high * tanh, or the
    output itself (``output="linear"``, the ARS paper's linear policy: the environment bounds it).

    ``hidden=()`` gives a linear policy (ARS's choice; no bias then, as in the paper). ``clip``: the
    observation normaliser's clipping of standardised inputs (None: none).
    """

    def __init__(self, obs_dim: int, discrete: bool, num_outputs: int, action_high: float = 1.0,
                 hidden: tuple[int, ...] = (16,), normalize: bool = True, output: str = "tanh",
                 clip: float | None = 5.0):
        super().__init__()
        if output not in POLICY_OUTPUTS:
            raise ValueError(f"policy output must be one of {list(POLICY_OUTPUTS)}; got {output!r}")
        self.discrete, self.action_high, self.output = discrete, action_high, output
        self.norm = ObservationNorm(obs_dim, clip=clip) if normalize else nn.Identity()
        sizes = [obs_dim, *hidden, num_outputs]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers.append(nn.Linear(a, b, bias=bool(hidden)))
            if i < len(sizes) - 2:
                layers.append(nn.Tanh())
        self.net = nn.Sequential(*layers)
        if not hidden:  # a linear policy starts at zero, as in ARS
            nn.init.zeros_(self.net[0].weight)
        self.obs_dim = obs_dim

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # weights saved by nesgpu 0.1.0 for a policy without normalisation (ARS V1) carry a never-updated
        # ObservationNorm (identity statistics that clip inputs to +-5): keep it, so those runs load and act
        # as they did (its statistics stay frozen: the task does not update them)
        if isinstance(self.norm, nn.Identity) and f"{prefix}norm.mean" in state_dict:
            self.norm = ObservationNorm(self.obs_dim).to(state_dict[f"{prefix}norm.mean"].device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.net(self.norm(obs))
        if self.discrete:
            return out.argmax(-1)
        return out if self.output == "linear" else self.action_high * torch.tanh(out)


def rollout(env, act, groups: torch.Tensor, seed: int, max_steps: int, obs_stats: bool = False,
            count: int | None = None, step=None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Run one episode in every row of ``env`` with ``act(obs) -> action``; rows of the same group (ids in
    [0, count), default: one group per row) start from the same state.

    Returns (episode return per row (float64), steps per row, observation statistics). A row's return
    stops counting when it terminates; the loop stops when every row is done or at ``max_steps``.
    All-done is checked every 16 steps, so the hot loop does not wait on the device at each step.
    ``step`` (default :func:`env_step`) advances every row by one step, e.g. a :class:`CompiledStep`.
    """
    obs = env.reset(seed, groups, groups.numel() if count is None else count)
    n = obs.shape[0]
    device = obs.device
    total = torch.zeros(n, dtype=torch.float64, device=device)
    lengths = torch.zeros(n, dtype=torch.long, device=device)
    alive = torch.ones(n, dtype=torch.bool, device=device)
    # observation sums per row, reduced over rows once at the end (fewer ops in the loop)
    row_sum = torch.zeros(n, obs.shape[1], dtype=torch.float64, device=device) if obs_stats else None
    row_sum_sq = torch.zeros_like(row_sum) if obs_stats else None
    if step is None:
        for t in range(max_steps):
            obs, total, lengths, alive, row_sum, row_sum_sq = env_step(env, act, obs, total, lengths, alive,
                                                                       row_sum, row_sum_sq)
            if t % 16 == 15 and not alive.any():
                break
    else:  # a compiled step runs step.steps environment steps per call, none past max_steps
        # the first step eagerly: it records that the policy's modules used their noise (the bypass check)
        # and fills their per-call caches, so the compiled program always sees them in the same state
        obs, total, lengths, alive, row_sum, row_sum_sq = env_step(env, act, obs, total, lengths, alive, row_sum,
                                                                   row_sum_sq)
        for t in range(1, max_steps, step.steps):
            obs, total, lengths, alive, row_sum, row_sum_sq = step(env, act, obs, total, lengths, alive, row_sum,
                                                                   row_sum_sq, t=t, max_steps=max_steps)
            if not alive.any():
                break
    stats = {}
    if obs_stats:  # every row counts one observation for each step it was alive: its length
        stats = {"sum": row_sum.sum(0), "sum_sq": row_sum_sq.sum(0), "count": lengths.sum().double()}
    return total, lengths, stats


def env_step(env, act, obs, total, lengths, alive, row_sum=None, row_sum_sq=None):
    """One step of every row, the body of :func:`rollout`: observation statistics of the live rows, the
    action, the environment step, and the running return, length and liveness. Written without in-place
    updates of its inputs, so that ``torch.compile`` can make it one program (:class:`CompiledStep`)."""
    if row_sum is not None:
        live = obs.to(torch.float64) * alive.unsqueeze(1)
        row_sum = row_sum + live
        row_sum_sq = row_sum_sq + live * live  # alive is 0 or 1, so live * live = alive * obs^2
    action = act(obs)
    if action.dtype in (torch.bfloat16, torch.float16):  # a policy under autocast: numpy has no bf16
        action = action.float()
    obs, reward, terminated = env.step(action)
    total = total + reward.to(total.device) * alive
    lengths = lengths + alive
    alive = alive & ~terminated.to(alive.device)
    return obs, total, lengths, alive, row_sum, row_sum_sq


class CompiledStep:
    """``steps`` calls of :func:`env_step` of one torch environment and policy as one compiled program
    (``torch.compile``, inductor): the environment's dynamics and the population forward fused, instead of
    a few hundred small eager ops per environment step, and one call (with its guard checks) per ``steps``
    steps. The environment's state travels as an argument; steps past the episode limit change nothing.
    Compiling takes seconds on the first rollout (and again for a new shape); results match the eager
    step within float rounding."""

    def __init__(self, env, act, steps: int = 8):
        self.env, self.act, self.steps = env, act, steps
        self.compiled = torch.compile(self._run, dynamic=False)

    def _run(self, state, t, limit, obs, total, lengths, alive, row_sum, row_sum_sq):
        self.env.state = state
        for i in range(self.steps):
            alive = alive & (t + i < limit)  # the time limit: a row past it is done
            obs, total, lengths, alive, row_sum, row_sum_sq = env_step(self.env, self.act, obs, total, lengths,
                                                                       alive, row_sum, row_sum_sq)
        alive = alive & (t + self.steps < limit)
        return self.env.state, obs, total, lengths, alive, row_sum, row_sum_sq

    def __call__(self, env, act, obs, total, lengths, alive, row_sum=None, row_sum_sq=None, *, t: int,
                 max_steps: int):
        if env is not self.env or act is not self.act:
            raise ValueError("a CompiledStep runs the environment and policy it was built for")
        device = obs.device
        t = torch.tensor(t, device=device)  # tensors, not ints: one program for every t and limit
        limit = torch.tensor(max_steps, device=device)
        state, *out = self.compiled(env.state, t, limit, obs, total, lengths, alive, row_sum, row_sum_sq)
        env.state = state
        return tuple(out)




def check_spaces(env_spec) -> None:
    """An environment declares its action space whole: ``discrete = True`` with ``num_actions`` (the policy
    gives one score per action and the environment gets the index of the largest), or ``discrete = False``
    with ``action_dim`` and ``action_high``."""
    name = getattr(env_spec, "__name__", type(env_spec).__name__)
    for attribute in ("obs_dim", "discrete", "max_steps"):
        if not hasattr(env_spec, attribute):
            raise TypeError(f"{name} declares no {attribute}; an environment declares obs_dim, discrete, max_steps "
                            f"and its actions (num_actions, or action_dim and action_high)")
    if env_spec.discrete and not (isinstance(env_spec.num_actions, int) and env_spec.num_actions >= 2):
        raise ValueError(f"{name} declares discrete = True with num_actions = {env_spec.num_actions!r}; a discrete "
                         f"environment declares num_actions >= 2, its number of actions (step then gets a (rows,) "
                         f"long tensor of action indices)")
    if not env_spec.discrete and not (isinstance(env_spec.action_dim, int) and env_spec.action_dim >= 1):
        raise ValueError(f"{name} declares discrete = False with action_dim = {env_spec.action_dim!r}; a continuous "
                         f"environment declares action_dim >= 1 (and action_high, the bound of every action)")


class RLTask:
    """Fitness = episode return of every member; metric = mean return of the plain policy.

    Rows are laid out (sign, episode, direction): ``episodes`` start states per step, each shared by all
    directions and both signs (common random numbers). Start states of step t come from (seed, t), so a
    resumed run sees the same episodes.

    Args:
        make_env: ``make_env(n, device)`` -> an environment of n rows (a TorchEnv or a GymVectorEnv).
        env_spec: the environment class (or instance) with obs_dim, discrete, num_actions / action_dim,
            action_high and max_steps.
        episodes: episodes per member per step.
        eval_episodes: episodes of the final evaluation.
        compile: run each environment step of a torch environment and the population forward as one
            compiled program (:class:`CompiledStep`); gymnasium environments always run eagerly.
        normalize_observations: keep running observation statistics in the policy's ObservationNorm and
            standardise inputs by them (False: raw observations, as ARS V1).
        reward_shift: subtracted from the reward of every step of a training rollout (ARS's survival-bonus
            shift: a Hopper that stands still no longer scores 1 per step); evaluations are unshifted.
        start_states: "shared": every direction and both signs start from the step's ``episodes`` start
            states (common random numbers); "independent": every row from a start state of its own (the
            ARS paper).
        policy_output: "tanh" (bounded actions) or "linear" (the raw output: ARS's linear policy; gymnasium
            environments then get the action unclipped, as the paper's did).
        observation_clip: clipping of standardised observations (None: none, as ARS).
    """

    metric = "eval_return"
    summed_info = frozenset({"env_steps", "obs_sum", "obs_sum_sq", "obs_count"})

    def __init__(self, make_env, env_spec, name: str, episodes: int = 1, eval_episodes: int = 10,
                 max_steps: int | None = None, device: torch.device | str = "cpu", seed: int = 0,
                 normalize_observations: bool = True, compile: bool = False, reward_shift: float = 0.0,
                 start_states: str = "shared", policy_output: str = "tanh", observation_clip: float | None = 5.0):
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1; got {episodes}")
        check_spaces(env_spec)
        if start_states not in START_STATES:
            raise ValueError(f"start_states must be one of {list(START_STATES)}; got {start_states!r}")
        if policy_output not in POLICY_OUTPUTS:
            raise ValueError(f"policy_output must be one of {list(POLICY_OUTPUTS)}; got {policy_output!r}")
        self.reward_shift, self.start_states = float(reward_shift), start_states
        self.policy_output, self.observation_clip = policy_output, observation_clip
        self.make_env, self.spec, self.name = make_env, env_spec, name
        self.episodes, self.eval_episodes = episodes, eval_episodes
        self.max_steps = max_steps or env_spec.max_steps
        self.device = torch.device(device)
        self.seed = seed
        self.normalize_observations = normalize_observations
        self.compile = compile
        self._env = None
        self._compiled: CompiledStep | None = None

    def make_model(self, hidden: tuple[int, ...] = (16,), model: str = "mlp") -> Policy:
        """The policy: an MLP with ``hidden`` sizes (tanh), or a linear one for ``hidden=()``. ``model``:
        "mlp", or "default" (a task of your own's run: this task's own model, the MLP)."""
        if model not in ("mlp", "default"):
            raise ValueError(f"unknown model {model!r} for task {self.name!r}; expected one of ['mlp']")
        outputs = self.spec.num_actions if self.spec.discrete else self.spec.action_dim
        return Policy(self.spec.obs_dim, self.spec.discrete, outputs, self.spec.action_high, hidden,
                      normalize=self.normalize_observations, output=self.policy_output, clip=self.observation_clip)

    @property
    def default_target(self) -> float | None:
        """The return at which the environment counts as solved, where it says (gymnasium's reward_threshold)."""
        return getattr(self.spec, "reward_threshold", None)

    def _env_for(self, n: int):
        if self._env is None or self._env.n != n:
            self._env = self.make_env(n, self.device)
        return self._env

    def _norm(self, pm: PerturbedModel) -> ObservationNorm | None:
        norm = pm.model.norm if isinstance(pm.model, Policy) else None
        return norm if self.normalize_observations and isinstance(norm, ObservationNorm) else None

    def fitness(self, pm: PerturbedModel, step: int) -> tuple[torch.Tensor, dict]:
        """Returns (signs * episodes, D_local) of the directions whose noise is drawn, and the step's
        statistics. Observation statistics are returned, not applied: :meth:`finish_step` merges them
        once the whole population (every chunk, every rank) has run with the same normalisation."""
        signs, e, d = (2 if pm.antithetic else 1), self.episodes, pm.local_directions
        if self.start_states == "shared":
            groups, count = torch.arange(e, device=self.device).view(1, e, 1).expand(signs, e, d).reshape(-1), e
        else:  # row (sign, episode, direction) by its global index: other blocks and ranks get other states
            first, total = pm.noise_range.start, pm.directions
            ids = torch.arange(signs * e, device=self.device).view(signs, e, 1) * total
            groups = (ids + first + torch.arange(d, device=self.device)).reshape(-1)
            count = signs * e * total
        normalizing = self._norm(pm) is not None
        env = self._env_for(groups.numel())
        with pm.perturbing():  # once per rollout, not once per environment step
            returns, lengths, stats = rollout(env, pm.model, groups, derive_seed(self.seed, step, _ENV_STREAM),
                                              self.max_steps, normalizing, count=count,
                                              step=self._step_for(env, pm))
        info = {"env_steps": lengths.sum(), "episode_return": returns.mean()}
        if self.reward_shift:  # every live step, the last one included, as in ARS's rollouts
            returns = returns - self.reward_shift * lengths
        if normalizing:
            info.update(obs_sum=stats["sum"], obs_sum_sq=stats["sum_sq"], obs_count=stats["count"])
        return returns.view(signs * e, d), info

    def _step_for(self, env, pm: PerturbedModel):
        """The compiled environment step for ``env`` and the policy when compiling (torch environments
        only), else None (the eager step)."""
        if not self.compile or not isinstance(env, TorchEnv):
            return None
        if self._compiled is None or self._compiled.env is not env or self._compiled.act is not pm.model:
            self._compiled = CompiledStep(env, pm.model)
        return self._compiled

    def finish_step(self, pm: PerturbedModel, info: dict) -> None:
        """Merge the step's observation statistics (summed over chunks and ranks) into the policy."""
        norm = self._norm(pm)
        if norm is not None and "obs_count" in info:
            norm.update(info["obs_sum"], info["obs_sum_sq"], info["obs_count"])

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> float:
        """Mean return of the plain model over ``eval_episodes`` fixed start states."""
        groups = torch.arange(self.eval_episodes, device=self.device)
        returns, _, _ = rollout(self.make_env(self.eval_episodes, self.device), model, groups,
                                derive_seed(self.seed, EVAL_STREAM), self.max_steps)
        return returns.mean().item()
