"""SB3 members for structured mode: evolving Stable-Baselines3 policies (kind ``sb3``) learning with PPO
(learner ``ppo``).

A student member wraps an sb3-contrib ``MaskablePPO`` (``MultiInputPolicy`` on the student's Dict
observation, illegal candidates masked by the observation's ``action_mask``); a teacher member a plain
``PPO`` over the teacher's ``MultiDiscrete`` DSL action; a self-play (``both``) member holds one of each.
The genome is the SB3 policies' ``state_dict`` (floating tensors, keys prefixed ``teacher.`` /
``student.``): a plain genome, so the dense-parameter operators apply (mutations ``gaussian`` and
``layer_gaussian``; crossovers ``interpolate``, ``uniform``, ``dare``, ``es``, ``extrapolate`` -- the
defaults of ``PBTConfig``); the LoRA-only ones raise ``ValueError``.

The ``ppo`` learner is SB3's own PPO update on the member's decisions of one generation: it fills the
model's rollout buffer (values and old log-probabilities from the current weights, masks for
``MaskablePPO``), computes returns and advantages, and calls the model's ``train()`` (``n_epochs`` passes
of minibatches of ``batch_size``, clipped surrogate, value and entropy terms). Every seat decision is its
own one-step episode, so its return is the reward credited to it and its advantage ``r - V(s)``.

Options are ``PBTConfig.member_options["sb3"]`` (see ``SB3Options``; the learning rate is
``PBTConfig.learner_config.lr``; ``LearnerConfig.steps`` is not used, PPO's passes are ``n_epochs``)::

    PBTConfig(run_dir="runs/sb3", teachers="scripted", students="sb3", learner="ppo",
              learner_config=LearnerConfig(lr=3e-4),
              member_options={"sb3": {"net_arch": [64, 64], "n_epochs": 4, "batch_size": 32}})

Importing this module registers ``POLICIES["sb3"]`` and ``LEARNERS["ppo"]``; ``evolve`` imports it on
first use of either name, so a config naming them needs no import (the optional extra
``populora-env[sb3]`` must be installed).

Plugging in your own SB3 algorithm: any on-policy algorithm with PPO's constructor arguments whose
``train()`` reads ``self.rollout_buffer`` (a subclass of ``PPO`` or ``MaskablePPO`` with another loss,
another policy class...) can stand in for a role. Register a member kind that passes it::

    from evolve.members import POLICIES
    from evolve.sb3_members import SB3Options, SB3Policy

    def my_members(env, role, seed, config):
        options = SB3Options.from_member_options(config.member_options)
        return SB3Policy(env, role, seed, options, algorithms={"teacher": MyPPO, "student": MyMaskablePPO})

    POLICIES["my_sb3"] = my_members  # then PBTConfig(students="my_sb3", learner="ppo", ...)

A student algorithm must use masks the way ``MaskablePPO`` does (a maskable policy and rollout buffer),
or the learner's masks are dropped; register the kind in a module the Ray actors import too.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium
import numpy as np
import torch
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.utils import obs_as_tensor

from evolve.learners import LEARNERS, LearnerConfig
from evolve.members import POLICIES, is_finite_number, is_int_at_least, options_from
from evolve.protocols import ROLES, LearnStats, Transition

DEFAULT_ALGORITHMS: dict[str, type[BaseAlgorithm]] = {"teacher": PPO, "student": MaskablePPO}
"""The SB3 algorithm of each role: masks matter only to students (a teacher's every DSL choice is legal)."""


@dataclass(frozen=True)
class SB3Options:
    """Hyper-parameters of SB3 members and their PPO learner (``PBTConfig.member_options["sb3"]``).

    Defaults are SB3's own, except ``device`` (CPU: these MLPs are too small to gain from a GPU, and
    CPU results are bit-reproducible).
    """

    net_arch: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the actor and the critic (separate networks, SB3's default layout)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Activation of the hidden layers."""
    n_epochs: int = 10
    """PPO passes over a generation's decisions."""
    batch_size: int = 64
    """Minibatch size (raised by the fewest samples that avoid a one-sample last minibatch, whose
    advantage normalisation would be undefined)."""
    clip_range: float = 0.2
    """PPO's clipping of the probability ratio (Schulman et al. 2017, eq. 7)."""
    clip_range_vf: float | None = None
    """Clipping of the value change (``None``: no clipping)."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    max_grad_norm: float = 0.5
    """Gradient norm clipping."""
    normalize_advantage: bool = True
    """Standardise advantages within each minibatch."""
    target_kl: float | None = None
    """Stop a generation's passes early when the approximate KL exceeds ``1.5 * target_kl``."""
    device: str = "cpu"
    """Torch device of the SB3 models (``"auto"``: SB3 picks CUDA when there is one)."""

    def __post_init__(self) -> None:
        if not (
            isinstance(self.net_arch, tuple)
            and self.net_arch
            and all(is_int_at_least(n, 1) for n in self.net_arch)
        ):
            raise ValueError(f"net_arch must be a non-empty list of ints >= 1, got {self.net_arch!r}")
        if self.activation not in ("tanh", "relu"):
            raise ValueError(f"activation must be 'tanh' or 'relu', got {self.activation!r}")
        if not is_int_at_least(self.n_epochs, 1):
            raise ValueError(f"n_epochs must be an int >= 1, got {self.n_epochs!r}")
        if not is_int_at_least(self.batch_size, 2):
            raise ValueError(f"batch_size must be an int >= 2, got {self.batch_size!r}")
        for name in ("clip_range", "clip_range_vf", "target_kl"):
            value = getattr(self, name)
            if (value is not None or name == "clip_range") and not (is_finite_number(value) and value > 0):
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        for name in ("ent_coef", "vf_coef"):
            value = getattr(self, name)
            if not (is_finite_number(value) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if not (is_finite_number(self.max_grad_norm) and self.max_grad_norm > 0):  # 0 clips every step away
            raise ValueError(f"max_grad_norm must be a number > 0, got {self.max_grad_norm!r}")
        if not isinstance(self.normalize_advantage, bool):
            raise ValueError(f"normalize_advantage must be a bool, got {self.normalize_advantage!r}")
        if not isinstance(self.device, str):
            raise ValueError(f"device must be a str, got {self.device!r}")
        if self.device != "auto":  # SB3's own choice: CUDA when there is one
            try:
                device = torch.device(self.device)
            except RuntimeError as error:
                raise ValueError(f"device: not a torch device, {self.device!r} ({error})") from None
            if device.type == "cuda" and not torch.cuda.is_available():  # SB3 fell back to the CPU silently
                raise ValueError(f"device {self.device!r}: no CUDA device on this machine")
        # numpy's numbers pass the checks above; stored as Python's
        object.__setattr__(self, "net_arch", tuple(int(n) for n in self.net_arch))
        for name in ("n_epochs", "batch_size"):
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("clip_range", "clip_range_vf", "target_kl", "ent_coef", "vf_coef", "max_grad_norm"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def from_member_options(cls, member_options: Mapping[str, Any]) -> SB3Options:
        """Reads ``member_options["sb3"]`` (absent: defaults).

        Raises:
            ValueError: Not a dict, an unknown option, or a bad value; the message names the option.
        """
        raw = member_options.get("sb3", {})
        for name in ("lr", "learning_rate"):
            if isinstance(raw, dict) and name in raw:
                raise ValueError(f"member_options['sb3'][{name!r}]: the learning rate is learner_config.lr")
        if isinstance(raw, dict) and isinstance(raw.get("net_arch"), list):  # JSON has lists, not tuples
            raw = {**raw, "net_arch": tuple(raw["net_arch"])}
        return options_from(cls, {"sb3": raw}, "sb3")


class _SpacesEnv(gymnasium.Env):
    """Carries one seat's spaces so SB3 can build a model; never stepped (play goes through ``act``)."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space) -> None:
        self.observation_space = observation_space
        self.action_space = action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Not playable: PBT plays the AEC env and calls ``SB3Policy.act``."""
        raise RuntimeError("a spaces-only env: SB3 members play through the PBT loop, not model.learn")

    def step(self, action: Any) -> Any:
        """Not playable (see ``reset``)."""
        raise RuntimeError("a spaces-only env: SB3 members play through the PBT loop, not model.learn")


def _build_model(
    algorithm: type[BaseAlgorithm], observation_space: Any, action_space: Any, options: SB3Options
) -> Any:
    activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[options.activation]
    return algorithm(  # type: ignore[call-arg]
        "MultiInputPolicy",
        _SpacesEnv(observation_space, action_space),
        n_steps=options.batch_size,  # unused: the learner sizes a buffer to each generation's decisions
        batch_size=options.batch_size,
        n_epochs=options.n_epochs,
        clip_range=options.clip_range,
        clip_range_vf=options.clip_range_vf,
        ent_coef=options.ent_coef,
        vf_coef=options.vf_coef,
        max_grad_norm=options.max_grad_norm,
        normalize_advantage=options.normalize_advantage,
        target_kl=options.target_kl,
        policy_kwargs={"net_arch": list(options.net_arch), "activation_fn": activation},
        device=options.device,
        verbose=0,
    )


def _batch(observations: Sequence[Mapping[str, Any]], space: Any) -> dict[str, np.ndarray]:
    """Stacks Dict observations into ``{key: (N, *shape)}`` arrays."""
    return {
        key: np.stack([np.asarray(o[key]) for o in observations]).reshape(len(observations), *sub.shape)
        for key, sub in space.spaces.items()
    }


def _masks(observations: Sequence[Mapping[str, Any]]) -> np.ndarray:
    return np.stack([np.asarray(o["action_mask"], dtype=bool) for o in observations])  # (N, K)


def _categorical_probs(distribution: Any) -> list[torch.Tensor]:
    """The per-dimension probabilities ``(1, n_d)`` of an SB3 (maskable) categorical distribution."""
    inner = distribution.distribution
    return [d.probs for d in inner] if isinstance(inner, list) else [inner.probs]


class SB3Policy:
    """An evolvable member made of SB3 models, one per role it plays.

    Sampling is reproducible: ``act`` reads the SB3 policy's action distribution
    (``policy.get_distribution``) and samples it with the member's own ``torch.Generator`` (SB3's
    ``predict`` would draw from torch's global RNG). Initial weights are drawn from ``seed`` with the
    global torch RNG forked and restored.

    Args:
        env: a structured-mode TeacherStudent-v0 env (its ``observation_space``/``action_space``).
        role: ``teacher``, ``student`` or ``both`` (self-play).
        seed: seed of the initial weights and of the sampler (until ``reseed``).
        options: hyper-parameters of the models.
        algorithms: SB3 algorithm class per role (default ``PPO`` for teachers, ``MaskablePPO`` for students).

    Attributes:
        models: the SB3 model of each role played.
        seed: the construction seed (the PPO learner seeds its minibatch shuffling with it).
    """

    def __init__(
        self,
        env: Any,
        role: str,
        seed: int,
        options: SB3Options,
        algorithms: Mapping[str, type[BaseAlgorithm]] = DEFAULT_ALGORITHMS,
    ) -> None:
        if role not in ("teacher", "student", "both"):
            raise ValueError(f"role must be 'teacher', 'student' or 'both', got {role!r}")
        if env.unwrapped.config.mode != "structured":
            raise ValueError(f"sb3 members need env mode 'structured', got {env.unwrapped.config.mode!r}")
        self.options = options
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.models: dict[str, Any] = {}
        with torch.random.fork_rng(devices=[]):  # SB3 initialises from the global RNG: seed it, then restore
            torch.manual_seed(seed)
            for name in ROLES if role == "both" else (role,):
                agent = f"{name}_0"
                self.models[name] = _build_model(
                    algorithms[name], env.observation_space(agent), env.action_space(agent), options
                )

    # ----- genome --------------------------------------------------------------------------------
    def get_genome(self) -> dict[str, torch.Tensor]:
        """Detached copies of the SB3 policies' floating tensors, keys ``<role>.<state_dict key>``."""
        return {
            f"{role}.{key}": value.detach().clone()
            for role, model in self.models.items()
            for key, value in model.policy.state_dict().items()
            if value.is_floating_point()
        }

    def set_genome(self, genome: Mapping[str, torch.Tensor]) -> None:
        """Loads a genome with exactly this member's keys and shapes (``ValueError`` naming a mismatch)."""
        own = self.get_genome()
        if set(genome) != set(own):
            raise ValueError(f"genome keys differ: missing {sorted(set(own) - set(genome))}, "
                             f"unexpected {sorted(set(genome) - set(own))}")  # fmt: skip
        for key, value in genome.items():
            if tuple(value.shape) != tuple(own[key].shape):
                raise ValueError(
                    f"genome key {key!r}: shape {tuple(value.shape)}, expected {tuple(own[key].shape)}"
                )
        for role, model in self.models.items():
            state = model.policy.state_dict()  # in place: the optimiser keeps its parameters
            state.update({key: genome[f"{role}.{key}"] for key in state if f"{role}.{key}" in genome})
            model.policy.load_state_dict(state)

    def reseed(self, seed: int) -> None:
        """Restarts the sampling generator (the loop does this every generation)."""
        self.generator.manual_seed(seed)

    # ----- acting --------------------------------------------------------------------------------
    def act(self, observation: Mapping[str, Any], agent: str) -> Any:
        """Samples ``agent``'s action from its role's SB3 policy with the member's generator."""
        role = "teacher" if agent.startswith("teacher") else "student"
        if role not in self.models:
            raise ValueError(f"this member plays {sorted(self.models)}, not {agent!r}")
        policy = self.models[role].policy
        policy.set_training_mode(False)
        with torch.no_grad():
            obs, _ = policy.obs_to_tensor(dict(observation))
            if role == "student" and "action_mask" in observation and _is_maskable(self.models[role]):
                distribution = policy.get_distribution(obs, action_masks=_masks([observation]))
            else:
                distribution = policy.get_distribution(obs)
            picks = [  # the generator is a CPU one (the same draws on any device): CUDA probabilities come over
                int(torch.multinomial(p[0].cpu(), 1, generator=self.generator))
                for p in _categorical_probs(distribution)
            ]
        if role == "teacher":
            return np.asarray(picks, dtype=np.int64)
        return picks[0]


def _is_maskable(model: Any) -> bool:
    return issubclass(model.rollout_buffer_class, MaskableRolloutBuffer | MaskableDictRolloutBuffer)


@contextlib.contextmanager
def _numpy_global_rng(rng: np.random.Generator) -> Iterator[None]:
    """Runs the block with numpy's global RNG seeded from ``rng``, then restores the global state.

    SB3's rollout buffers shuffle minibatches with ``np.random.permutation``; pinning it to a state drawn
    from the learner's own generator makes the update reproducible without disturbing anyone else.
    """
    saved = np.random.get_state()
    np.random.seed(int(rng.integers(2**32)))
    try:
        yield
    finally:
        np.random.set_state(saved)


def _safe_batch_size(samples: int, batch_size: int) -> int:
    """The smallest minibatch size ``>= batch_size`` whose last minibatch is not a single sample."""
    while samples % batch_size == 1:
        batch_size += 1
    return batch_size


PPO_INFO = ("approx_kl", "clip_fraction", "entropy_loss", "value_loss", "explained_variance")
"""The figures of SB3's PPO ``train()`` (its logger's ``train/<name>``) that ``PPOLearner`` reports per role."""


class PPOLearner:
    """SB3's PPO update for an ``SB3Policy``, one rollout buffer per role per generation.

    The state (``state_dict``) is each role's Adam state plus the minibatch shuffling generator, so a run
    resumed from a checkpoint continues bit-identically.

    Args:
        policy: the member (an ``SB3Policy``).
        config: the learning rate (``steps`` is not used: PPO's passes are ``SB3Options.n_epochs``).
    """

    def __init__(self, policy: SB3Policy, config: LearnerConfig) -> None:
        if not isinstance(policy, SB3Policy):
            raise ValueError(
                f"the ppo learner trains SB3Policy members (kind 'sb3'), got {type(policy).__name__}"
            )
        self.policy = policy
        self.config = config
        self.rng = np.random.default_rng(policy.seed)
        self.logger = Logger(folder=None, output_formats=[])  # SB3's train() records its losses here
        for model in policy.models.values():
            model.set_logger(self.logger)
            model.learning_rate = config.lr
            model._setup_lr_schedule()  # a constant schedule: PBT has no global training horizon
        self.reset()

    def update(self, policy: Any, experience: Sequence[Transition]) -> LearnStats:
        """A PPO update of each role's model on that role's decisions (roles with fewer than 2 are skipped).

        Returns:
            The mean over roles of SB3's ``train/loss`` (last minibatch), the transitions used, and as
            ``info`` each trained role's ``PPO_INFO`` figures of SB3's logger (``"student/approx_kl"``...).
        """
        if policy is not self.policy:
            raise ValueError("a PPOLearner updates only the policy it was built for")
        by_role: dict[str, list[Transition]] = {}
        for t in experience:
            by_role.setdefault(t.role, []).append(t)
        losses, samples, info = [], 0, {}
        for role, batch in sorted(by_role.items()):
            if role not in self.policy.models:
                raise ValueError(
                    f"experience of role {role!r} for a member playing {sorted(self.policy.models)}"
                )
            if len(batch) < 2:
                continue
            losses.append(self._train(self.policy.models[role], batch))
            samples += len(batch)
            info.update(
                {f"{role}/{name}": float(self.logger.name_to_value[f"train/{name}"]) for name in PPO_INFO}
            )
        return LearnStats(float(np.mean(losses)) if losses else float("nan"), samples, info)

    def _train(self, model: Any, batch: Sequence[Transition]) -> float:
        model.rollout_buffer = fill_rollout_buffer(model, batch)
        model.batch_size = _safe_batch_size(len(batch), self.policy.options.batch_size)
        model._current_progress_remaining = 1.0  # constant schedules (lr, clip range)
        with _numpy_global_rng(self.rng):
            model.train()
        return float(self.logger.name_to_value["train/loss"])

    def state_dict(self) -> dict[str, Any]:
        """Each role's Adam state and the shuffling generator's state."""
        return {
            "optimizers": {role: m.policy.optimizer.state_dict() for role, m in self.policy.models.items()},
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores ``state_dict()`` (a copy of it: torch's optimisers would otherwise share its tensors)."""
        state = copy.deepcopy(state)
        for role, model in self.policy.models.items():
            model.policy.optimizer.load_state_dict(state["optimizers"][role])
        self.rng.bit_generator.state = state["rng"]

    def reset(self) -> None:
        """Fresh optimisers (the weights were replaced by an operator's child); the generator continues."""
        for model in self.policy.models.values():
            policy = model.policy
            policy.optimizer = policy.optimizer_class(
                policy.parameters(), lr=self.config.lr, **policy.optimizer_kwargs
            )


def fill_rollout_buffer(model: Any, batch: Sequence[Transition]) -> Any:
    """A rollout buffer of ``model``'s class holding ``batch`` as one-step episodes, returns computed.

    Values and old log-probabilities come from the current weights (``policy.evaluate_actions``), as SB3's
    ``collect_rollouts`` records them while acting; with every step an episode start and the last one
    done, GAE gives ``advantage = r - V(s)`` and ``return = r`` (Schulman et al. 2016, eq. 16 with no
    next state).
    """
    policy = model.policy
    n = len(batch)
    observations = [t.observation for t in batch]
    obs = _batch(observations, model.observation_space)
    actions = np.stack(
        [np.asarray(t.action, dtype=np.int64).reshape(model.action_space.shape) for t in batch]
    )
    maskable = _is_maskable(model)
    masks = _masks(observations) if maskable else None
    policy.set_training_mode(False)
    with torch.no_grad():
        obs_t = obs_as_tensor(obs, model.device)
        actions_t = torch.as_tensor(actions, device=model.device)
        kwargs = {"action_masks": masks} if maskable else {}
        values, log_probs, _ = policy.evaluate_actions(obs_t, actions_t, **kwargs)  # (N, 1), (N,)
    buffer = model.rollout_buffer_class(
        n, model.observation_space, model.action_space, model.device, gamma=model.gamma,
        gae_lambda=model.gae_lambda, n_envs=1, **model.rollout_buffer_kwargs,
    )  # fmt: skip
    for i, t in enumerate(batch):
        extra = {"action_masks": masks[i : i + 1]} if masks is not None else {}
        buffer.add(
            {key: value[i : i + 1] for key, value in obs.items()},
            actions[i : i + 1],
            np.array([t.reward], dtype=np.float32),
            np.array([True]),  # every decision starts its own episode
            values[i : i + 1],
            log_probs[i : i + 1],
            **extra,
        )
    buffer.compute_returns_and_advantage(last_values=torch.zeros(1), dones=np.array([True]))
    return buffer


def sb3_policy(env: Any, role: str, seed: int, config: Any) -> SB3Policy:
    """``POLICIES["sb3"]``: an ``SB3Policy`` with ``config.member_options["sb3"]``."""
    return SB3Policy(env, role, seed, SB3Options.from_member_options(config.member_options))


POLICIES["sb3"] = sb3_policy
LEARNERS["ppo"] = PPOLearner
