"""LoRA LLM members for ``evolve``'s PBT loop: ``POLICIES["lora"]`` and ``LEARNERS["grpo"]``.

Importing this module (``import agents`` does) registers both. Every LoRA member of a process shares one
``LoRAPopulation`` per base and LoRA shape: one frozen base, one adapter per member. Options come from
``PBTConfig.member_options`` (JSON values, part of the run's fingerprint)::

    PBTConfig(..., env=TeacherStudentConfig(mode="text", ...), teachers="lora", students="lora",
              learner="grpo", member_options={"lora": {"base": base_dir, "rank": 8, "prefill": True},
                                              "grpo": {"learning_rate": 1e-2, "loss_type": "dapo"}})

``member_options["lora"]`` holds the fields of :class:`LoRAMemberOptions`; ``member_options["grpo"]`` the
fields of ``agents.grpo.GRPOConfig`` except ``temperature`` and ``max_new_tokens`` (taken from the LoRA
options, so that the learner scores completions under the sampler's settings) and ``group_size``/``seed``
(used only by ``GRPOLearner.step``, which PBT does not call).

A member's genome is its adapter's tensors (PEFT keys); its learner maps the member's transitions of a
generation to one GRPO update: the prompt the model saw, the completion it generated (the action minus
any prefilled scaffold), the reward the env credited to that decision, one GRPO group per (role, prompt)
and AZR's (role, task type) key.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from agents.base import build_tiny_base
from agents.grpo import GRPOConfig, GRPOLearner
from agents.grpo_config import MIN_TEMPERATURE, UpdateStats
from agents.policy import LoRAPolicy, model_input
from agents.population import LoRAPopulation
from evolve.learners import LEARNERS, LearnerConfig
from evolve.members import POLICIES, is_finite_number, is_int_at_least, options_from
from evolve.protocols import LearnStats, Transition
from populora_env.tasks import TASK_TYPES

__all__ = [
    "GRPOMemberLearner",
    "LoRAMember",
    "LoRAMemberOptions",
    "grpo_info",
    "grpo_inputs",
    "shared_population",
]

_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}
# GRPOConfig fields PBT members do not take from member_options["grpo"] (see the module docstring).
_GRPO_FROM_LORA = ("temperature", "max_new_tokens")
_GRPO_UNUSED = ("group_size", "seed")


@dataclass(frozen=True)
class LoRAMemberOptions:
    """Options of LoRA members, given as ``PBTConfig.member_options["lora"]`` (validated on construction)."""

    base: str | None = None
    """Base model: a local Hugging Face directory or a Hub id; ``None`` builds (or reuses, cached) the tiny
    offline base of ``agents.build_tiny_base()``."""
    rank: int = 8
    """LoRA rank ``r`` of every member's adapter."""
    alpha: float | None = None
    """LoRA alpha; ``None`` means ``alpha = rank``."""
    target_modules: list[str] | str | None = None
    """Modules to adapt; ``None`` is PEFT's default for the architecture, ``"all-linear"`` every linear."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Base dtype: ``auto`` is bf16 where the device computes it natively, else fp32 (adapters are fp32)."""
    device: str | None = None
    """Device of the shared population; ``None`` picks CUDA when available."""
    max_new_tokens: int = 64
    """Generation budget per action (also the learner's completion cap)."""
    temperature: float = 1.0
    """Sampling temperature (> 0: GRPO needs sampled completions); the learner scores under the same."""
    top_p: float = 1.0
    """Nucleus mass in ``(0, 1]``."""
    prefill: bool = True
    """Start every answer with the env's answer scaffold (``agents.policy.answer_prefill``): the scaffold is
    part of the action and of the learner's prompt, not of the trained completion."""

    def __post_init__(self) -> None:
        where = "member_options['lora']"
        if self.base is not None and (not isinstance(self.base, str) or not self.base):
            raise ValueError(f"{where}['base'] must be a non-empty string or None, got {self.base!r}")
        for name in ("rank", "max_new_tokens"):
            value = getattr(self, name)
            if not is_int_at_least(value, 1):
                raise ValueError(f"{where}[{name!r}] must be an int >= 1, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.alpha is not None and not (is_finite_number(self.alpha) and self.alpha > 0):
            raise ValueError(f"{where}['alpha'] must be a finite number > 0 or None, got {self.alpha!r}")
        targets = self.target_modules
        if not (targets is None or isinstance(targets, str) or
                (isinstance(targets, list | tuple) and targets and all(isinstance(t, str) for t in targets))):  # fmt: skip
            raise ValueError(f"{where}['target_modules'] must be a string, a list of strings or None, "
                             f"got {targets!r}")  # fmt: skip
        if self.dtype not in _DTYPES:
            raise ValueError(f"{where}['dtype'] must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.device is not None and not isinstance(self.device, str):
            raise ValueError(f"{where}['device'] must be a string or None, got {self.device!r}")
        if not (is_finite_number(self.temperature) and self.temperature >= MIN_TEMPERATURE):
            raise ValueError(  # the learner scores under it: logits / T overflows near 1e-37
                f"{where}['temperature'] must be a finite number >= {MIN_TEMPERATURE:g}, got {self.temperature!r}"
            )
        if not (is_finite_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"{where}['top_p'] must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.prefill, bool):
            raise ValueError(f"{where}['prefill'] must be a bool, got {self.prefill!r}")
        for name in ("alpha", "temperature", "top_p"):  # numpy's numbers pass the checks; stored as Python's
            if not isinstance(getattr(self, name), int | float | None):
                object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def from_member_options(cls, member_options: Mapping[str, Any]) -> LoRAMemberOptions:
        """Reads ``member_options["lora"]`` (absent: all defaults).

        Raises:
            ValueError: an unknown or invalid option, named.
        """
        return options_from(cls, member_options, "lora")

    def population_key(self) -> tuple[Any, ...]:
        """What the shared population depends on (members with equal keys share one)."""
        targets = (
            tuple(self.target_modules)
            if isinstance(self.target_modules, list | tuple)
            else self.target_modules
        )
        return (self.base, self.rank, self.alpha, targets, self.dtype, self.device)


def grpo_config(member_options: Mapping[str, Any], lora: LoRAMemberOptions) -> GRPOConfig:
    """``GRPOConfig`` from ``member_options["grpo"]``, with the LoRA options' temperature and token cap.

    Raises:
        ValueError: an unknown or invalid option, named.
    """
    given = member_options.get("grpo", {})
    if isinstance(given, Mapping):
        for name in _GRPO_FROM_LORA:
            if name in given:
                raise ValueError(
                    f"member_options['grpo'][{name!r}] comes from member_options['lora'][{name!r}]"
                )
        for name in _GRPO_UNUSED:
            if name in given:
                raise ValueError(
                    f"member_options['grpo'][{name!r}] is unused by PBT members (GRPOLearner.step only)"
                )
    config = options_from(GRPOConfig, member_options, "grpo", max_new_tokens=lora.max_new_tokens)
    return dataclasses.replace(config, temperature=float(lora.temperature))


# ----- one population per base, shared by every member of the process --------------------------------------
class _Shared:
    """A shared population, its adapter counter, and adapters of dead members waiting to be removed.

    The population keeps a ``placeholder`` adapter that no member uses (a PEFT model keeps at least one).
    """

    def __init__(self, population: LoRAPopulation) -> None:
        self.population = population
        self.created = 0
        self.dead: list[str] = []  # appended by finalizers (at any time), drained at the next member creation

    def new_adapter(self, role: str, genome: Mapping[str, torch.Tensor]) -> str:
        dead, self.dead = self.dead, []  # list.append and this swap are atomic: no lock for finalizers
        for name in dead:
            self.population.remove(name)
        self.created += 1
        name = f"{role}_{self.created}"
        self.population.add(name, genome)
        return name

    def forget(self, name: str) -> None:
        self.dead.append(name)


_SHARED: dict[tuple[Any, ...], _Shared] = {}


def _shared(options: LoRAMemberOptions) -> _Shared:
    key = options.population_key()
    if key not in _SHARED:
        base = options.base if options.base is not None else str(build_tiny_base())
        population = LoRAPopulation.from_pretrained(
            base, ["placeholder"], rank=options.rank, alpha=options.alpha,
            target_modules=options.target_modules, dtype=_DTYPES[options.dtype], device=options.device,
        )  # fmt: skip
        _SHARED[key] = _Shared(population)
    return _SHARED[key]


def shared_population(member_options: Mapping[str, Any]) -> LoRAPopulation:
    """The population the LoRA members of ``member_options`` share in this process (loaded on first use)."""
    return _shared(LoRAMemberOptions.from_member_options(member_options)).population


def initial_genome(population: LoRAPopulation, seed: int) -> dict[str, torch.Tensor]:
    """PEFT's LoRA init drawn from ``seed``: ``lora_A`` kaiming-uniform (a = sqrt 5), ``lora_B`` zero.

    Drawn from a local generator over the keys in sorted order, so a member's initial weights depend only
    on its seed (not on the adapter's name or on how many members the process created before it).
    """
    generator = torch.Generator().manual_seed(seed)
    genome = population.get_genome(population.adapter_names[0])
    for key in sorted(genome):
        value = genome[key]
        if ".lora_A." in key:
            # kaiming_uniform_(a=sqrt(5)) bound (PEFT's reset_lora_parameters): 1 / sqrt(fan_in)
            bound = 1.0 / math.sqrt(value.shape[1])
            genome[key] = (torch.rand(value.shape, generator=generator) * 2 - 1) * bound
        else:
            genome[key] = torch.zeros_like(value)
    return genome


# ----- the member ---------------------------------------------------------------------------------------------
class LoRAMember:
    """A PBT member: one adapter of the shared population as an evolvable text-mode ``Policy``.

    ``act``/``act_batch``/``reseed`` are ``LoRAPolicy``'s; ``get_genome``/``set_genome`` read and write the
    adapter's tensors (PEFT keys). The adapter is removed from the shared population after the member is
    garbage-collected (at the next member's creation, never in the middle of a forward pass).

    Args:
        env: the env (its config must be text mode).
        role: ``teacher``, ``student`` or ``both``.
        seed: the member's seed (initial weights and first sampling seed).
        member_options: ``PBTConfig.member_options``.
    """

    def __init__(self, env: Any, role: str, seed: int, member_options: Mapping[str, Any]) -> None:
        mode = getattr(getattr(getattr(env, "unwrapped", env), "config", None), "mode", "text")
        if mode != "text":
            raise ValueError(f"lora members play text mode; set env.mode='text' (got {mode!r})")
        self.options = LoRAMemberOptions.from_member_options(member_options)
        self.grpo_config = grpo_config(member_options, self.options)
        shared = _shared(self.options)
        self.population = shared.population
        self.role = role
        self.adapter = shared.new_adapter(role, initial_genome(shared.population, seed))
        weakref.finalize(self, shared.forget, self.adapter)
        o = self.options
        self.policy = LoRAPolicy(self.population, self.adapter, max_new_tokens=o.max_new_tokens,
                                 temperature=o.temperature, seed=seed, top_p=o.top_p, prefill=o.prefill,
                                 keep_ids=True)  # fmt: skip

    def act(self, observation: Any, agent: str) -> str:
        """The adapter's generated answer (raw text; the env scores malformed text as a format error)."""
        return self.policy.act(observation, agent)

    def act_batch(self, observations: Sequence[Any], agents: Sequence[str]) -> list[str]:
        """Answers to several observations in one batched generation."""
        return self.policy.act_batch(observations, agents)

    def sample_record(self, observation: Any, action: Any) -> list[int] | None:
        """The token ids this member sampled for ``action`` (``Transition.sample``), so that its learner
        trains on them wherever it runs; ``None`` for an action it did not generate since its last reseed."""
        split = _prompt_and_completion(observation, action, self.options.prefill)
        return None if split is None else self.policy.sampled_ids(*split)

    def reseed(self, seed: int) -> None:
        """Restarts the sampling seeds (the PBT loop does this every generation)."""
        self.policy.reseed(seed)

    def get_genome(self) -> dict[str, torch.Tensor]:
        """Copies of the adapter's tensors (``lora_A`` ``(r, in)``, ``lora_B`` ``(out, r)``)."""
        return self.population.get_genome(self.adapter)

    def set_genome(self, genome: dict[str, torch.Tensor]) -> None:
        """Loads a genome with the adapter's keys and shapes (``ValueError`` naming a mismatch)."""
        self.population.set_genome(self.adapter, genome)


def grpo_inputs(experience: Sequence[Transition], prefill: bool) -> dict[str, list[Any]]:
    """``GRPOLearner.update`` keyword arguments (all but ``adapter``) for a member's transitions.

    Prompts are ``model_input(observation, prefill)``'s; a completion is the action minus the prefilled
    scaffold; a group is every completion of the member's role on one prompt (the same observation, hence
    the same distribution to sample from); the task key is ``(role, task type)`` (AZR's TRR++).

    Raises:
        ValueError: an action that does not start with its prefilled scaffold (not this member's output).
    """
    columns: dict[str, list[Any]] = {
        k: [] for k in ("prompts", "completions", "rewards", "group_ids", "task_keys")
    }
    for t in experience:
        split = _prompt_and_completion(t.observation, t.action, prefill)
        if split is None:
            raise ValueError(f"{t.agent}'s action does not start with the prefilled answer scaffold")
        prompt, completion = split
        task_type = TASK_TYPES[int(t.observation["task_type"])]
        group: Hashable = (t.role, prompt)
        columns["prompts"].append(prompt)
        columns["completions"].append(completion)
        columns["rewards"].append(float(t.reward))
        columns["group_ids"].append(group)
        columns["task_keys"].append((t.role, task_type))
    return columns


def _prompt_and_completion(observation: Any, action: Any, prefill: bool) -> tuple[str, str] | None:
    """The model input of ``observation`` and what the model generated of ``action`` (the action minus the
    prefilled scaffold); ``None`` if the action does not start with that scaffold."""
    prompt, prefix = model_input(observation, prefill)
    text = str(action)
    return (prompt, text[len(prefix) :]) if text.startswith(prefix) else None


def _is_token_ids(sample: Any) -> bool:
    return isinstance(sample, list) and bool(sample) and all(isinstance(i, int) for i in sample)


# ----- the learner --------------------------------------------------------------------------------------------
class GRPOMemberLearner:
    """``LEARNERS["grpo"]``: one GRPO update of a LoRA member's adapter per generation, on the token ids
    the member sampled (the text re-tokenised when they are not known).

    GRPO's hyper-parameters come from ``member_options["grpo"]`` (through the member); ``learner_config``
    (REINFORCE's) must stay at its default so that no setting is silently ignored. The state is the
    adapter's AdamW state (moments and step counts), so checkpoints resume exactly.

    Args:
        policy: a :class:`LoRAMember`.
        config: ``PBTConfig.learner_config`` (must be ``LearnerConfig()``).
    """

    def __init__(self, policy: Any, config: LearnerConfig) -> None:
        if not isinstance(policy, LoRAMember):
            raise ValueError(f"the grpo learner trains lora members, got a {type(policy).__name__}")
        if config != LearnerConfig():
            raise ValueError("learner_config is REINFORCE's; set GRPO's hyper-parameters in "
                             "member_options['grpo'] (e.g. {'learning_rate': 1e-2})")  # fmt: skip
        self.policy = policy
        self.grpo = GRPOLearner(policy.population, policy.grpo_config)

    def update(self, policy: Any, experience: Sequence[Transition]) -> LearnStats:
        """One GRPO update on the member's transitions of a generation (``nan`` loss if skipped)."""
        if policy is not self.policy:
            raise ValueError("a GRPOMemberLearner updates only the member it was built for")
        if not experience:
            return LearnStats(float("nan"), 0)
        inputs = grpo_inputs(experience, self.policy.options.prefill)
        # Train on the sampled token ids (re-tokenising the text can split it otherwise under BPE): those
        # the transition carries (recorded where the episode was played, e.g. another Ray actor), else
        # those this member kept; without both for every transition, the text re-tokenised.
        ids = [
            t.sample if _is_token_ids(t.sample) else self.policy.policy.sampled_ids(p, c)
            for t, p, c in zip(experience, inputs["prompts"], inputs["completions"], strict=True)
        ]
        completion_ids = ids if all(row for row in ids) else None
        stats = self.grpo.update(self.policy.adapter, **inputs, completion_ids=completion_ids)
        roles = [role for role, _ in inputs["task_keys"]]
        return LearnStats(stats.loss, stats.num_samples, grpo_info(stats, roles))

    def state_dict(self) -> dict[str, Any]:
        """The adapter's AdamW state."""
        return self.grpo.optimizer_for(self.policy.adapter).state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores ``state_dict()`` into a fresh optimizer for the adapter."""
        self.grpo.reset_optimizer(self.policy.adapter)
        self.grpo.optimizer_for(self.policy.adapter).load_state_dict(state)

    def reset(self) -> None:
        """Forgets the adapter's optimizer state (its weights were replaced by an operator's child)."""
        self.grpo.reset_optimizer(self.policy.adapter)


def grpo_info(stats: UpdateStats, roles: Sequence[str] | None = None) -> dict[str, float]:
    """The figures of a GRPO update that PBT logs per member (``LearnStats.info``): ``completions`` and those
    ``truncated`` (no stop token among their trained tokens; absent when the update was skipped for a
    non-finite reward, before tokenising), active ``tokens``, ``clip_fraction``, ``grad_norm``, ``kl`` (with a
    KL term only) and ``skipped`` (1 for an update that was skipped). With ``roles`` (the role of each
    completion, in the batch's order) also ``completions_<role>`` and ``truncated_<role>`` for each role in the
    batch (a self-play member's holds both), so that the teachers' cut-off share is told from the students'.
    """
    info = {
        "completions": float(stats.num_samples),
        "tokens": float(stats.num_tokens),
        "clip_fraction": stats.clip_fraction,
        "grad_norm": stats.grad_norm,
        "skipped": float(stats.skipped),
    }
    if roles is not None and len(roles) != stats.num_samples:
        raise ValueError(f"roles: one per completion, got {len(roles)} for {stats.num_samples}")
    per_role = Counter(roles) if roles is not None else Counter()  # (in order of first appearance)
    for role, count in per_role.items():
        info[f"completions_{role}"] = float(count)
    # (unknown for an update skipped before tokenising: not counted as 0)
    if stats.truncated_rows is not None:
        info["truncated"] = float(len(stats.truncated_rows))
        if roles is not None:
            cut = Counter(roles[row] for row in stats.truncated_rows)
            for role in per_role:
                info[f"truncated_{role}"] = float(cut[role])
    if stats.kl is not None:
        info["kl"] = stats.kl
    return info


def _lora_member(env: Any, role: str, seed: int, config: Any) -> LoRAMember:
    learner = config.learner_for(role)
    if learner not in ("grpo", "none"):
        raise ValueError(f"lora members learn with learner='grpo' (or 'none'), got {learner!r} for {role}s")
    return LoRAMember(env, role, seed, config.member_options)


POLICIES["lora"] = _lora_member
LEARNERS["grpo"] = GRPOMemberLearner
