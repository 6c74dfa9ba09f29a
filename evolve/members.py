"""Small torch policies for structured mode (evolvable: a genome is their ``state_dict``), scripted members.

``TorchPolicy`` has a teacher head, a student head or both (self-play). The student head is a set scorer
in the DeepSets style (Zaheer et al. 2017, "Deep Sets", NeurIPS): every candidate is scored from its own
encoding, its difference to the mean of the legal candidates, its standardised agreement with the other
candidates and the task context, so the policy is invariant to the env's candidate order. The teacher
head is an MLP over the task type and the reference programs with one categorical per ``MultiDiscrete``
component. Values go through ``symlog`` (``sign(x) log(1 + |x|)``, DreamerV3, Hafner et al. 2023)
because encoded literals reach +-1000.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from evolve.operators import LazyRegistry, Registry
from populora_env import dsl
from populora_env.game import TeacherStudentConfig

N_TASK_TYPES = 3


@dataclass(frozen=True)
class NetConfig:
    """Sizes of a member's torch policy."""

    hidden: int = 32
    """Hidden units of each head's MLP."""

    def __post_init__(self) -> None:
        if not is_int_at_least(self.hidden, 1):
            raise ValueError(f"hidden must be an int >= 1, got {self.hidden!r}")
        object.__setattr__(self, "hidden", int(self.hidden))


def symlog(x: torch.Tensor) -> torch.Tensor:
    """``sign(x) * log(1 + |x|)``."""
    return torch.sign(x) * torch.log1p(torch.abs(x))


def _init_linear(layer: nn.Linear, generator: torch.Generator) -> None:
    """PyTorch's default ``nn.Linear`` init (uniform, bound ``1/sqrt(fan_in)``) drawn from ``generator``."""
    bound = 1.0 / math.sqrt(layer.in_features)
    nn.init.uniform_(layer.weight, -bound, bound, generator=generator)
    nn.init.uniform_(layer.bias, -bound, bound, generator=generator)


def _one_hot(index: torch.Tensor, n: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(index.long(), n).float()


def _masked_mean(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Mean over the candidate axis (1) of ``x`` ``(N, K, F)`` weighted by ``weights`` ``(N, K, 1)``."""
    return (x * weights).sum(1, keepdim=True) / weights.sum(1, keepdim=True).clamp(min=1.0)


def _set_features(cands: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The legal candidates' mean ``(N, 1, W)`` and each candidate's standardised agreement ``(N, K, 1)``.

    Agreement is the mean fraction of components a candidate shares with each other legal candidate (a
    relational set feature). It does not point at the right answer: the env builds every candidate, the
    right one included, one change away from a hidden decoy (``populora_env.candidates``). It is
    standardised within the set, so one weight ranks the candidates whatever the task's scale.
    """
    k = cands.shape[1]
    weights = mask.float().unsqueeze(-1)
    same = (cands.unsqueeze(2) == cands.unsqueeze(1)).float().mean(-1)  # (N, K, K)
    pair = (mask.unsqueeze(2) & mask.unsqueeze(1)).float() * (1.0 - torch.eye(k))
    agreement = (same * pair).sum(2, keepdim=True) / pair.sum(2, keepdim=True).clamp(min=1.0)  # (N, K, 1)
    centred = (agreement - _masked_mean(agreement, weights)) * weights
    spread = _masked_mean(centred.square(), weights).sqrt().clamp(min=1e-3)
    return _masked_mean(cands, weights), centred / spread


class TorchPolicy(nn.Module):
    """A structured-mode policy with a teacher head and/or a student head.

    Args:
        env_config: the env's config (spaces are derived from it; ``mode`` must be ``structured``).
        roles: ``teacher``, ``student`` or ``both``.
        net: layer sizes.
        seed: seed of the initial weights and of the sampling generator.
    """

    def __init__(
        self,
        env_config: TeacherStudentConfig,
        roles: Literal["teacher", "student", "both"],
        net: NetConfig,
        seed: int,
    ) -> None:
        super().__init__()
        if env_config.mode != "structured":
            raise ValueError(f"TorchPolicy needs mode='structured', got {env_config.mode!r}")
        self.roles = roles
        self.nvec = [int(n) for n in dsl.action_nvec(env_config.n_slots)]
        width = dsl.program_width(env_config.n_slots)
        cand_width = max(width, dsl.VALUE_WIDTH)
        self.generator = torch.Generator().manual_seed(seed)
        init = torch.Generator().manual_seed(seed)
        if roles in ("teacher", "both"):
            teacher_in = N_TASK_TYPES + env_config.n_references * width
            self.teacher_body = nn.Linear(teacher_in, net.hidden)
            self.teacher_out = nn.Linear(net.hidden, sum(self.nvec))
        if roles in ("student", "both"):
            context = N_TASK_TYPES + width + env_config.induction_max_inputs * 2 * dsl.VALUE_WIDTH
            self.student_body = nn.Linear(2 * cand_width + 1 + context, net.hidden)
            self.student_out = nn.Linear(net.hidden, 1)
        for layer in self.children():
            assert isinstance(layer, nn.Linear)
            _init_linear(layer, init)
        self.requires_grad_(True)

    # ----- genome --------------------------------------------------------------------------------
    def get_genome(self) -> dict[str, torch.Tensor]:
        """A detached copy of the parameters."""
        return {key: value.detach().clone() for key, value in self.state_dict().items()}

    def set_genome(self, genome: dict[str, torch.Tensor]) -> None:
        """Loads a genome with exactly this policy's keys and shapes (``ValueError`` naming a mismatch)."""
        own = self.state_dict()
        if set(genome) != set(own):
            raise ValueError(f"genome keys differ: missing {sorted(set(own) - set(genome))}, "
                             f"unexpected {sorted(set(genome) - set(own))}")  # fmt: skip
        for key, value in genome.items():
            if value.shape != own[key].shape:
                raise ValueError(
                    f"genome key {key!r}: shape {tuple(value.shape)}, expected {tuple(own[key].shape)}"
                )
        self.load_state_dict(genome)

    def reseed(self, seed: int) -> None:
        """Restarts the sampling generator (the loop does this every generation)."""
        self.generator.manual_seed(seed)

    # ----- features ------------------------------------------------------------------------------
    def _teacher_logits(self, observations: Sequence[dict[str, Any]]) -> torch.Tensor:
        task_type = torch.as_tensor(np.array([o["task_type"] for o in observations]))
        refs = torch.as_tensor(np.stack([o["references"] for o in observations])).flatten(1)
        x = torch.cat([_one_hot(task_type, N_TASK_TYPES), symlog(refs)], dim=1)
        return self.teacher_out(torch.tanh(self.teacher_body(x)))  # (N, sum(nvec))

    def _student_logits(self, observations: Sequence[dict[str, Any]]) -> torch.Tensor:
        task_type = torch.as_tensor(np.array([o["task_type"] for o in observations]))
        program = torch.as_tensor(np.stack([o["program"] for o in observations])).float()
        nvec = torch.as_tensor(self.nvec, dtype=torch.float32)
        pairs = torch.as_tensor(np.stack([o["pairs"] for o in observations])).flatten(1)
        context = torch.cat([_one_hot(task_type, N_TASK_TYPES), program / nvec, symlog(pairs)], dim=1)
        cands = symlog(torch.as_tensor(np.stack([o["candidates"] for o in observations])))  # (N, K, W)
        mask = torch.as_tensor(np.stack([o["action_mask"] for o in observations])).bool()  # (N, K)
        k = cands.shape[1]
        mean, agreement = _set_features(cands, mask)
        x = torch.cat([cands, cands - mean, agreement, context.unsqueeze(1).expand(-1, k, -1)], dim=2)
        scores = self.student_out(torch.tanh(self.student_body(x))).squeeze(-1)  # (N, K)
        return scores.masked_fill(~mask, -1e9)

    # ----- acting and log-probabilities ----------------------------------------------------------
    def act(self, observation: dict[str, Any], agent: str) -> Any:
        """Samples an action from the policy's own generator."""
        with torch.no_grad():
            if agent.startswith("teacher"):
                logits = self._teacher_logits([observation])[0]
                parts = torch.split(logits, self.nvec)
                picks = [
                    int(torch.multinomial(torch.softmax(p, 0), 1, generator=self.generator)) for p in parts
                ]
                return np.asarray(picks, dtype=np.int64)
            probs = torch.softmax(self._student_logits([observation])[0], 0)
            return int(torch.multinomial(probs, 1, generator=self.generator))

    def log_prob(self, role: str, observations: Sequence[Any], actions: Sequence[Any]) -> torch.Tensor:
        """Log-probabilities ``(N,)`` of ``actions`` under the current weights (differentiable)."""
        if role == "teacher":
            logits = self._teacher_logits(observations)
            taken = torch.as_tensor(np.stack([np.asarray(a) for a in actions]))  # (N, D)
            total = torch.zeros(len(observations))
            for d, part in enumerate(torch.split(logits, self.nvec, dim=1)):
                total = total + torch.log_softmax(part, 1).gather(1, taken[:, d : d + 1]).squeeze(1)
            return total
        logits = self._student_logits(observations)
        taken = torch.as_tensor([int(a) for a in actions]).unsqueeze(1)
        return torch.log_softmax(logits, 1).gather(1, taken).squeeze(1)


def scripted_policy(kind: str, role: str, env: Any, seed: int, strength: float) -> Any:
    """A member without a genome: ``scripted`` (``ScriptedTeacher`` with difficulty ``strength``; a student
    with skill ``strength``: ``ExecutingStudent`` in structured mode, ``ReferenceStudent`` in text mode) or
    ``random``."""
    from populora_env.policies import ExecutingStudent, RandomPolicy, ReferenceStudent, ScriptedTeacher

    if kind == "random":
        return RandomPolicy(env, seed=seed)
    if role == "teacher":
        return ScriptedTeacher(env, difficulty=strength, seed=seed)
    if env.unwrapped.config.mode == "text":
        return ReferenceStudent(env, skill=strength, seed=seed)
    return ExecutingStudent(env, skill=strength, seed=seed)


def is_finite_number(value: object) -> bool:
    """A real number (not a bool) that is finite; numpy's ints and floats count (a value read from an array)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def is_int_at_least(value: object, least: int) -> bool:
    """An integer (not a bool; numpy's count) that is at least ``least``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= least


def options_from(cls: Any, member_options: Mapping[str, Any], kind: str, **fixed: Any) -> Any:
    """A member kind's options dataclass ``cls`` from ``PBTConfig.member_options[kind]`` (absent: defaults).

    Args:
        cls: a dataclass validating itself in ``__post_init__`` (``ValueError`` naming the field).
        member_options: the run's ``member_options``.
        kind: the key of this kind's options (``lora``, ``grpo``, ``sb3``...).
        **fixed: values given by the caller, overridden by the user's.

    Raises:
        ValueError: not a dict, an unknown option, or a bad value; the message says
            ``member_options['<kind>']`` and names the option.
    """
    where = f"member_options[{kind!r}]"
    given = member_options.get(kind, {})
    if not isinstance(given, Mapping):
        raise ValueError(f"{where} must be a dict of options, got {given!r}")
    allowed = [f.name for f in dataclasses.fields(cls)]
    if unknown := sorted(set(given) - set(allowed)):
        raise ValueError(f"{where} has unknown option(s) {unknown}; options: {allowed}")
    try:
        return cls(**{**fixed, **given})
    except (TypeError, ValueError) as error:  # (the options' own messages may name where already)
        raise ValueError(str(error) if str(error).startswith(where) else f"{where}: {error}") from None


PolicyFactory = Callable[[Any, str, int, Any], Any]
"""``(env, role, seed, pbt_config) -> policy``; ``role`` is ``teacher``, ``student`` or ``both``."""


def _torch_policy(env: Any, role: str, seed: int, config: Any) -> TorchPolicy:
    return TorchPolicy(config.env, role, config.net, seed)  # type: ignore[arg-type]


def _scripted(env: Any, role: str, seed: int, config: Any) -> Any:
    return scripted_policy("scripted", role, env, seed, config.scripted_strength)


def _random(env: Any, role: str, seed: int, config: Any) -> Any:
    return scripted_policy("random", role, env, seed, config.scripted_strength)


POLICIES: Registry = LazyRegistry(
    "policy kind",
    {"torch": _torch_policy, "scripted": _scripted, "random": _random},
    lazy={"sb3": ("evolve.sb3_members", "sb3"), "lora": ("agents.members", "llm")},
)
"""Member kinds by name. A kind whose policies have ``get_genome``/``set_genome`` (``EvolvablePolicy``)
evolves and gets the run's learner; others (scripted) only play. ``sb3`` (``evolve.sb3_members``) and
``lora`` (``agents.members``) are imported on first lookup, so ``evolve`` needs neither extra unless a run
uses them. Other packages plug in their members with ``POLICIES["mine"] = factory``; a policy that draws
random numbers needs ``reseed(seed)`` (the loop calls it before each generation with a seed from the run's
generator), or a resumed, extended or Ray run differs from an uninterrupted local one (a warning says so).
On the Ray backend, a kind registered at run time must also be registered in the actors' processes
(register it in a module they import)."""
