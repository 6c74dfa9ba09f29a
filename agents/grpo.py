"""The GRPO learner for one LoRA adapter of a population: update, and the generate-score-update step.

The maths lives in `agents.grpo_loss` (pure functions), the config and result records in
`agents.grpo_config` (re-exported here), tokenising and shared-prefix log-probs in `agents.grpo_batch`.
This module runs the inner epochs with gradient accumulation, keeps one AdamW state per adapter name, and
guards against non-finite numbers. The schedule follows TRL's `GRPOTrainer` with `steps_per_generation ==
gradient_accumulation_steps`: one generation batch is one optimizer step, repeated `num_inner_epochs`
times (TRL's `num_iterations`, μ in the GRPO paper).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import numbers
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from agents.base import deterministic_kernels, no_cudnn_attention
from agents.generation import stop_token_ids, texts_of, warn_past_context
from agents.grpo_batch import TokenBatch, encode_batch, only_trainable, shared_prefix_logps, truncated_rows
from agents.grpo_config import (
    LOSS_TYPES,
    SCALE_REWARDS,
    GRPOConfig,
    LossType,
    ScaleRewards,
    SkipReason,
    StepResult,
    UpdateStats,
)
from agents.grpo_loss import (
    AGGREGATIONS,
    AggregationContext,
    advantages_batch,
    advantages_group,
    advantages_task_relative,
    advantages_unscaled,
    clip_fractions,
    clipped_surrogate_loss,
    k3_kl,
    probability_ratio,
    segment_index,
)
from evolve.genome import first_non_finite

__all__ = [
    "LOSS_TYPES",
    "SCALE_REWARDS",
    "GRPOConfig",
    "GRPOLearner",
    "LossType",
    "ScaleRewards",
    "SkipReason",
    "StepResult",
    "TokenGeneratingPopulation",
    "TrainablePopulation",
    "UpdateStats",
]

logger = logging.getLogger(__name__)


GROUP_ADVANTAGES = {"group": advantages_group, "batch": advantages_batch, "none": advantages_unscaled}


class TrainablePopulation(Protocol):
    """What the learner needs from a population (implemented by `agents.population.LoRAPopulation`)."""

    model: Any
    tokenizer: Any

    @property
    def adapter_names(self) -> Sequence[str]: ...
    @property
    def device(self) -> torch.device: ...

    def trainable_parameters(self, name: str) -> list[nn.Parameter]: ...
    def set_active(self, name: str) -> None: ...
    def reference(self) -> contextlib.AbstractContextManager[Any]: ...
    def generate(
        self, prompts: list[str], adapters: list[str], max_new_tokens: int, temperature: float, seed: int
    ) -> list[str]: ...


@runtime_checkable
class TokenGeneratingPopulation(Protocol):
    """A population that can also return the generated token ids (`LoRAPopulation.generate_tokens`).

    `GRPOLearner.step` then trains on exactly the sampled tokens instead of re-tokenising the decoded text.
    """

    def generate_tokens(
        self, prompts: list[str], adapters: list[str], max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[int]]: ...


@dataclass
class _AdapterOptimizer:
    params: list[nn.Parameter]
    optimizer: torch.optim.AdamW
    param_ids: tuple[int, ...] = field(default=())


class GRPOLearner:
    """Trains adapters of one population with GRPO; one AdamW state per adapter name.

    Args:
        population: the population (see `TrainablePopulation`).
        config: hyper-parameters.
    """

    def __init__(self, population: TrainablePopulation, config: GRPOConfig) -> None:
        self.population = population
        self.config = config
        self._optimizers: dict[str, _AdapterOptimizer] = {}
        self._step_calls = 0
        self._warned: set[str] = set()  # warnings given once per learner

    # -- optimizer state per adapter -----------------------------------------------------------------

    def optimizer_for(self, adapter: str) -> torch.optim.AdamW:
        """The adapter's AdamW optimizer, created on first use (or anew when its parameters were replaced)."""
        params = list(self.population.trainable_parameters(adapter))
        ids = tuple(id(p) for p in params)
        slot = self._optimizers.get(adapter)
        if slot is None or slot.param_ids != ids:
            if slot is not None:
                logger.info("adapter %r has new parameter tensors: its optimizer state is reset", adapter)
            opt = torch.optim.AdamW(
                params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay
            )
            slot = _AdapterOptimizer(params=params, optimizer=opt, param_ids=ids)
            self._optimizers[adapter] = slot
        return slot.optimizer

    def reset_optimizer(self, adapter: str) -> None:
        """Forget the adapter's optimizer state (e.g. after evolution replaced its weights)."""
        self._optimizers.pop(adapter, None)

    # -- one update ----------------------------------------------------------------------------------

    def update(
        self,
        adapter: str,
        prompts: Sequence[str],
        completions: Sequence[str],
        rewards: Sequence[float],
        group_ids: Sequence[Hashable],
        task_keys: Sequence[Hashable] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> UpdateStats:
        """One GRPO update of `adapter` on scored completions. Once the update reaches the model (every
        call but a refused one, or one skipped for a non-finite reward or for every completion truncated
        under `mask_truncated_completions`), `adapter` is the population's active adapter afterwards, as
        after `set_active(adapter)`.

        Args:
            adapter: adapter name in the population.
            prompts: the prompt of each completion (N).
            completions: generated completion texts (N).
            rewards: one scalar reward per completion (N).
            group_ids: the GRPO group of each completion (completions of one prompt share one).
            task_keys: the (role, task type) key of each completion; required for scale_rewards="task_relative".
            completion_ids: the generated token ids of each completion, the stop token included when it
                stopped on one (as `LoRAPopulation.generate_tokens` returns them); None re-tokenises the
                completion texts and appends the tokenizer's EOS (one of the stop tokens; the text does not
                say which ended it) to those shorter than `max_new_tokens` (a guess: a text cut at the budget
                can re-tokenise shorter, and is then trained to stop; logged once). Ids beyond
                `config.max_new_tokens` are not trained (logged once: the reward was for the whole text).

        Returns:
            The update's statistics; `skipped=True` (adapter untouched) on a non-finite reward, loss or
            gradient norm, weights an optimizer step left non-finite, or (`mask_truncated_completions`) no
            completion that reached a stop token.

        Raises:
            KeyError: unknown adapter name.
            ValueError: inputs of different lengths, an empty batch, missing task_keys, or a
                completion_ids row that is empty or holds something other than the tokenizer's ids.
            TypeError: a single string, a dict, set or iterator where a sequence is expected, a reward that
                is not a number, or a group id or task key that is not hashable.
        """
        cfg = self.config
        self._check_inputs(adapter, prompts, completions, rewards, group_ids, task_keys, completion_ids)
        # float64: a group of equal rewards must get zero advantages (float32 rounding of the mean, divided
        # by the std plus a small eps, gave 0.07 to every sample of a group paid 100.3)
        reward_t = torch.tensor([float(r) for r in rewards], dtype=torch.float64)
        mean_reward = float(reward_t.mean())
        if not torch.isfinite(reward_t).all():
            bad = int((~torch.isfinite(reward_t)).nonzero()[0])
            where = f"reward[{bad}] = {reward_t[bad].item()}"
            return self._skip(adapter, "non_finite_reward", where, len(rewards), mean_reward)

        advantages = self._advantages(reward_t, group_ids, task_keys).float()  # (N,)
        self._warn_about_tokens(completion_ids)
        batch = encode_batch(
            self.population.tokenizer, prompts, completions, completion_ids, cfg.max_new_tokens
        )
        truncated = truncated_rows(batch, stop_token_ids(self.population.model, self.population.tokenizer))
        cut = tuple(truncated.nonzero().flatten().tolist())
        if cfg.mask_truncated_completions:
            if len(cut) == len(prompts):
                where = f"all {len(cut)} completions hold no stop token and mask_truncated_completions is on"
                return self._skip(adapter, "all_truncated", where, len(rewards), mean_reward, cut)
            batch.completion_mask[truncated] = 0.0
        # (a prompt of ~4 000 tokens trained silently on a model of 2 048 positions, where generation warned)
        warn_past_context(self.population.model, batch.prompt_ids.shape[1], batch.completion_ids.shape[1])
        chunks = [c for c in torch.arange(len(prompts)).tensor_split(cfg.grad_accum_steps) if c.numel() > 0]
        ctx = AggregationContext(
            num_sequences_in_batch=len(prompts),
            max_completion_length=cfg.max_new_tokens,
            num_items_in_batch=float(batch.completion_mask.sum()),
        )
        model = self.population.model
        was_training = model.training
        model.eval()  # no dropout: old and new log-probs must agree on the first epoch (TRL: disable_dropout)
        self.population.set_active(adapter)
        self.optimizer_for(adapter)  # creates the adapter's optimizer slot on first use
        try:
            with (
                deterministic_kernels(self.population.device, cfg.deterministic),
                no_cudnn_attention(self.population.device),  # batch lengths vary: see its docstring
                only_trainable(model, self._optimizers[adapter].params),
            ):
                ref_logps = self._no_grad_logps(batch, chunks, reference=True) if cfg.beta > 0 else None
                # With one inner epoch the old policy is the current one: use logps.detach() (TRL does too).
                old_logps = self._no_grad_logps(batch, chunks) if cfg.num_inner_epochs > 1 else None
                stats = self._optimise(
                    adapter, batch, chunks, ctx, advantages, old_logps, ref_logps, mean_reward
                )
                return replace(stats, truncated_rows=cut)
        finally:
            model.train(was_training)

    def _warn_about_tokens(self, completion_ids: Sequence[Sequence[int]] | None) -> None:
        """Once per learner: completions known by text only, or longer than the learner's token cap."""
        cap = self.config.max_new_tokens
        if completion_ids is None and "text" not in self._warned:
            self._warned.add("text")
            logger.warning(
                "GRPO update without completion_ids: completions are re-tokenised from their text, and EOS "
                "is appended to those shorter than max_new_tokens=%d (a text cut at the budget may "
                "re-tokenise shorter and be trained to stop); pass the sampled ids to train on exactly them",
                cap,
            )
        elif completion_ids is not None and "cap" not in self._warned:
            longer = [len(ids) for ids in completion_ids if len(ids) > cap]
            if longer:
                self._warned.add("cap")
                logger.warning(
                    "%d of %d completions have more tokens than GRPOConfig.max_new_tokens=%d (longest %d): "
                    "only their first %d tokens are trained, though their reward was for the whole text; "
                    "set max_new_tokens to the generation budget",
                    len(longer), len(completion_ids), cap, max(longer), cap,
                )  # fmt: skip

    def _optimise(
        self,
        adapter: str,
        batch: TokenBatch,
        chunks: list[torch.Tensor],
        ctx: AggregationContext,
        advantages: torch.Tensor,
        old_logps: list[torch.Tensor] | None,
        ref_logps: list[torch.Tensor] | None,
        mean_reward: float,
    ) -> UpdateStats:
        cfg = self.config
        slot = self._optimizers[adapter]
        # A copy to roll back to: later epochs step after earlier ones, and a step can leave non-finite weights
        # from finite gradients (an extreme learning rate)
        snapshot = _Snapshot.take(slot)
        losses, norms = [], []
        # token-weighted over every micro-batch and epoch: the stats do not depend on grad_accum_steps
        kl_sum = clipped_tokens = tokens = 0.0
        for epoch in range(cfg.num_inner_epochs):
            slot.optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for k, rows in enumerate(chunks):
                mask = batch.completion_mask[rows]
                logps = shared_prefix_logps(
                    self.population.model, self.population.device, batch, rows, self.config.temperature
                )  # (b, C)
                old = old_logps[k] if old_logps is not None else logps.detach()
                ratio = probability_ratio(logps, old, mask)
                per_token = clipped_surrogate_loss(ratio, advantages[rows], cfg.epsilon_low, cfg.epsilon_high)
                if ref_logps is not None:
                    kl = k3_kl(logps, ref_logps[k], mask)
                    per_token = per_token + cfg.beta * kl
                    kl_sum += float((kl.detach() * mask).sum())
                loss = AGGREGATIONS[cfg.loss_type](per_token, mask, ctx)
                if not torch.isfinite(loss):
                    where = f"loss = {loss.item()} at inner epoch {epoch}, micro-batch {k}"
                    return self._abort(
                        adapter, slot, snapshot, "non_finite_loss", where, len(advantages), mean_reward
                    )
                loss.backward()
                step_loss += float(loss.detach())
                active = float(mask.sum())
                tokens += active
                clipped = clip_fractions(
                    ratio.detach(), advantages[rows], mask, cfg.epsilon_low, cfg.epsilon_high
                )
                clipped_tokens += clipped.region * active
            norm = float(torch.nn.utils.clip_grad_norm_(slot.params, cfg.max_grad_norm))
            if not math.isfinite(norm):
                where = f"gradient norm = {norm} at inner epoch {epoch}"
                return self._abort(
                    adapter, slot, snapshot, "non_finite_grad_norm", where, len(advantages), mean_reward
                )
            try:
                slot.optimizer.step()
            except RuntimeError as error:  # AdamW's step size, lr / (1 - beta1 ** t), past float32's range
                if "overflow" not in str(error):
                    snapshot.restore(slot)
                    raise
                where = f"the optimizer step of inner epoch {epoch} overflowed: {error}"
                return self._abort(
                    adapter, slot, snapshot, "non_finite_weights", where, len(advantages), mean_reward
                )
            if (bad := first_non_finite(dict(enumerate(slot.params)))) is not None:
                where = f"after the optimizer step of inner epoch {epoch} (trainable tensor {bad})"
                return self._abort(
                    adapter, slot, snapshot, "non_finite_weights", where, len(advantages), mean_reward
                )
            losses.append(step_loss)
            norms.append(norm)
        slot.optimizer.zero_grad(set_to_none=True)
        return UpdateStats(
            adapter=adapter,
            skipped=False,
            skip_reason=None,
            loss=sum(losses) / len(losses),
            kl=kl_sum / max(tokens, 1.0) if ref_logps is not None else None,
            clip_fraction=clipped_tokens / max(tokens, 1.0),
            grad_norm=sum(norms) / len(norms),
            mean_reward=mean_reward,
            num_samples=len(advantages),
            num_tokens=int(ctx.num_items_in_batch),
            optimizer_steps=len(losses),
            truncated_rows=None,  # (set by `update`)
        )

    # -- generate, score, update ---------------------------------------------------------------------

    def step(
        self,
        adapter: str,
        prompts: Sequence[str],
        reward_fn: Callable[[str, str], float],
        *,
        task_keys: Sequence[Hashable] | None = None,
        seed: int | None = None,
    ) -> StepResult:
        """Generate `group_size` completions per prompt with the adapter, score them, and update it.

        Args:
            adapter: adapter name.
            prompts: distinct prompts; each becomes one GRPO group.
            reward_fn: reward_fn(prompt, completion) -> float (a verifier, never a model).
            task_keys: one (role, task type) key per prompt, for scale_rewards="task_relative".
            seed: generation seed; default config.seed + the number of earlier `step` calls that returned.

        Returns:
            The completions, their rewards and the update's statistics.
        """
        cfg = self.config
        if isinstance(prompts, str):
            raise TypeError("prompts must be a sequence of prompts, not a single string")
        if not prompts:
            raise ValueError("step needs at least one prompt")
        if task_keys is not None and len(task_keys) != len(prompts):
            raise ValueError(f"task_keys: one per prompt, got {len(task_keys)} for {len(prompts)} prompts")
        expanded = [p for p in prompts for _ in range(cfg.group_size)]
        groups = [i for i in range(len(prompts)) for _ in range(cfg.group_size)]
        keys = None if task_keys is None else [k for k in task_keys for _ in range(cfg.group_size)]
        generation: dict[str, Any] = dict(
            adapters=[adapter] * len(expanded),
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            seed=cfg.seed + self._step_calls if seed is None else seed,
        )
        ids: list[list[int]] | None = None
        if isinstance(self.population, TokenGeneratingPopulation):
            ids = self.population.generate_tokens(expanded, **generation)
            completions = texts_of(self.population.tokenizer, ids, getattr(self.population, "stop_ids", None))
        else:
            completions = self.population.generate(expanded, **generation)
        rewards = [float(reward_fn(p, c)) for p, c in zip(expanded, completions, strict=True)]
        stats = self.update(adapter, expanded, completions, rewards, groups, keys, completion_ids=ids)
        self._step_calls += 1  # only now: a step that raised can be retried with the same samples
        return StepResult(completions=tuple(completions), rewards=tuple(rewards), stats=stats)

    # -- helpers -------------------------------------------------------------------------------------

    def _check_inputs(
        self,
        adapter: str,
        prompts: Sequence[str],
        completions: Sequence[str],
        rewards: Sequence[float],
        group_ids: Sequence[Hashable],
        task_keys: Sequence[Hashable] | None,
        completion_ids: Sequence[Sequence[int]] | None,
    ) -> None:
        names = list(self.population.adapter_names)
        if adapter not in names:
            raise KeyError(f"unknown adapter {adapter!r}; the population has {names}")
        columns = {"prompts": prompts, "completions": completions, "rewards": rewards, "group_ids": group_ids}
        if task_keys is not None:
            columns["task_keys"] = task_keys
        if completion_ids is not None:
            columns["completion_ids"] = completion_ids
        if strings := [name for name, column in columns.items() if isinstance(column, str | bytes)]:
            raise TypeError(f"{strings[0]} must be a sequence with one entry per completion, not a string")
        # (a dict of rewards was read by its keys, {0: 1.0, 1: 0.0} as [0, 1]: the advantages reversed)
        if unordered := [n for n, column in columns.items() if isinstance(column, Mapping | Set | Iterator)]:
            kind = type(columns[unordered[0]]).__name__
            raise TypeError(f"{unordered[0]} must be a sequence with one entry per completion, not a {kind}")
        for i, reward in enumerate(rewards):
            if isinstance(reward, str | bytes) or not isinstance(reward, numbers.Real | torch.Tensor):
                raise TypeError(
                    f"rewards[{i}] must be a number, got a {type(reward).__name__}: {reward!r:.60}"
                )
        for name in ("group_ids", "task_keys"):
            for i, key in enumerate(columns.get(name, ())):
                if not isinstance(key, Hashable) or not _hashes(key):
                    raise TypeError(f"{name}[{i}] must be hashable (it names a group), got {key!r:.60}")
        if len({len(column) for column in columns.values()}) != 1:
            given = ", ".join(f"{name} {len(column)}" for name, column in columns.items())
            raise ValueError(f"every argument must have one entry per completion; got lengths {given}")
        if not prompts:
            raise ValueError("update needs at least one completion")
        if completion_ids is not None:
            vocabulary = _output_rows(self.population.model)
            for i, ids in enumerate(completion_ids):
                if len(ids) == 0:
                    raise ValueError(f"completion_ids[{i}] is empty; a generated completion has >= 1 token")
                if not all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocabulary for t in ids
                ):
                    raise ValueError(f"completion_ids[{i}] must hold token ids, ints in [0, {vocabulary})")
        if self.config.scale_rewards == "task_relative" and task_keys is None:
            raise ValueError(
                'scale_rewards="task_relative" needs task_keys (one (role, task type) per completion)'
            )

    def _advantages(
        self, rewards: torch.Tensor, group_ids: Sequence[Hashable], task_keys: Sequence[Hashable] | None
    ) -> torch.Tensor:
        if self.config.scale_rewards == "task_relative":
            assert task_keys is not None  # checked in _check_inputs
            return advantages_task_relative(rewards, segment_index(task_keys))
        return GROUP_ADVANTAGES[self.config.scale_rewards](rewards, segment_index(group_ids))

    @torch.no_grad()
    def _no_grad_logps(
        self, batch: TokenBatch, chunks: list[torch.Tensor], reference: bool = False
    ) -> list[torch.Tensor]:
        ctx = self.population.reference() if reference else contextlib.nullcontext()
        with ctx:
            return [
                shared_prefix_logps(
                    self.population.model, self.population.device, batch, rows, self.config.temperature
                )
                for rows in chunks
            ]

    def _abort(
        self,
        adapter: str,
        slot: _AdapterOptimizer,
        snapshot: _Snapshot | None,
        reason: SkipReason,
        where: str,
        n: int,
        mean_reward: float,
    ) -> UpdateStats:
        slot.optimizer.zero_grad(set_to_none=True)
        if snapshot is not None:
            snapshot.restore(slot)
        return self._skip(adapter, reason, where, n, mean_reward)

    def _skip(
        self,
        adapter: str,
        reason: SkipReason,
        where: str,
        n: int,
        mean_reward: float,
        truncated: tuple[int, ...] | None = None,
    ) -> UpdateStats:
        logger.warning(
            "GRPO update of adapter %r skipped (%s: %s); its weights and optimizer state are unchanged",
            adapter,
            reason,
            where,
        )
        nan = float("nan")
        return UpdateStats(
            adapter=adapter,
            skipped=True,
            skip_reason=reason,
            loss=nan,
            kl=None,
            clip_fraction=nan,
            grad_norm=nan,
            mean_reward=mean_reward,
            num_samples=n,
            num_tokens=0,
            optimizer_steps=0,
            truncated_rows=truncated,
        )


@dataclass
class _Snapshot:
    """Copies of an adapter's parameters and optimizer state, for rolling back a failed update."""

    tensors: list[torch.Tensor]
    optimizer_state: dict[str, Any]

    @classmethod
    def take(cls, slot: _AdapterOptimizer) -> _Snapshot:
        return cls([p.detach().clone() for p in slot.params], copy.deepcopy(slot.optimizer.state_dict()))

    def restore(self, slot: _AdapterOptimizer) -> None:
        with torch.no_grad():
            for p, saved in zip(slot.params, self.tensors, strict=True):
                p.copy_(saved)
        slot.optimizer.load_state_dict(self.optimizer_state)


def _hashes(key: object) -> bool:
    try:
        hash(key)
    except TypeError:  # (a tuple holding a list)
        return False
    return True


def _output_rows(model: Any) -> int:
    """Token ids the model can emit: its output embedding's rows (not ``len(tokenizer)``: padded
    vocabularies, Qwen's, can sample past the tokenizer), or any non-negative id for a model without one."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) else 2**63
