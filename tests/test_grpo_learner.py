"""GRPOLearner on a tiny offline PeftModel: which weights move, ratio 1 on-policy, NaN handling, learning."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import string
from collections.abc import Iterator
from typing import Any

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import agents.generation  # noqa: E402
import agents.grpo  # noqa: E402
from agents.base import no_cudnn_attention  # noqa: E402
from agents.generation import decode_tokens  # noqa: E402
from agents.grpo import GRPOConfig, GRPOLearner, LossType, UpdateStats  # noqa: E402
from agents.grpo_batch import TokenBatch, encode_batch, shared_prefix_logps, truncated_rows  # noqa: E402
from tests.agents_fixtures import one_torch_thread, tiny_base_dir  # noqa: E402

__all__ = ["one_torch_thread", "tiny_base_dir"]  # fixtures are used by name
pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHARS = string.ascii_lowercase + " "
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def build_char_tokenizer() -> Any:
    """A character-level tokenizer built offline with `tokenizers` (no hub access)."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(CHARS))}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    core.decoder = tokenizers.decoders.Fuse()
    core.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


class TinyPopulation:
    """The population interface the learner needs, over a 2-layer Llama with LoRA adapters "p0" and "p1"."""

    def __init__(self, names: tuple[str, ...] = ("p0", "p1"), seed: int = 0) -> None:
        self.tokenizer = build_char_tokenizer()
        self.tokenizer.padding_side = "left"
        config = transformers.LlamaConfig(
            vocab_size=len(self.tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=128,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
        lora = peft.LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]
        )
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            base = transformers.LlamaForCausalLM(config)
            # A random init with std 0.02 caps every logit near |h| * |w| ~ 1.3, so no adapter on the
            # blocks could make one token likely; a trained base has sharper output rows.
            base.lm_head.weight.data.mul_(10.0)
            self.model = peft.get_peft_model(base, lora, adapter_name=names[0])
            for name in names[1:]:
                self.model.add_adapter(name, lora)
        self.adapter_names = list(names)
        self.device = torch.device("cpu")

    def trainable_parameters(self, name: str) -> list[torch.nn.Parameter]:
        return [p for n, p in self.model.named_parameters() if "lora_" in n and f".{name}." in n]

    def set_active(self, name: str) -> None:
        self.model.set_adapter(name)

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        with self.model.disable_adapter():
            yield

    @torch.no_grad()
    def generate(
        self, prompts: list[str], adapters: list[str], max_new_tokens: int, temperature: float, seed: int
    ) -> list[str]:
        out = [""] * len(prompts)
        for name in dict.fromkeys(adapters):
            rows = [i for i, a in enumerate(adapters) if a == name]
            self.set_active(name)
            enc = self.tokenizer([prompts[i] for i in rows], return_tensors="pt", padding=True)
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                ids = self.model.generate(
                    **enc,
                    do_sample=True,
                    temperature=temperature,
                    top_k=0,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=0,
                    eos_token_id=2,
                )
            texts = self.tokenizer.batch_decode(ids[:, enc["input_ids"].size(1) :], skip_special_tokens=True)
            for i, text in zip(rows, texts, strict=True):
                out[i] = text
        return out


def snapshot(pop: TinyPopulation) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in pop.model.named_parameters()}


def changed(before: dict[str, torch.Tensor], pop: TinyPopulation) -> set[str]:
    return {n for n, p in pop.model.named_parameters() if not torch.equal(before[n], p.detach())}


PROMPTS = ["abc ", "hello ", "xy "]


def count_a(prompt: str, completion: str) -> float:
    """Verifiable reward: the share of 'a' characters in the completion (0 for an empty one)."""
    return completion.count("a") / len(completion) if completion else 0.0


# -- config ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("loss_type", "ppo"),
        ("scale_rewards", "std"),
        ("learning_rate", 0.0),
        ("epsilon_low", 1.0),
        ("epsilon_high", -0.1),
        ("beta", -1.0),
        ("num_inner_epochs", 0),
        ("grad_accum_steps", 0),
        ("max_grad_norm", float("inf")),
        ("group_size", 1),
        ("temperature", 0.0),
        ("temperature", 1e-40),  # logits / T overflowed: every log-prob NaN, every update skipped
        ("max_new_tokens", 0),
        ("seed", -1),
        # (a review: bools passed as 1; 1e39 raised inside AdamW's step naming no field, 1e300 as weight decay
        # left infinite weights from an update reported as done; a seed of 2**64 failed at the first step)
        ("learning_rate", True),
        ("num_inner_epochs", True),
        ("learning_rate", 1e39),
        ("epsilon_high", 1e300),
        ("weight_decay", 1e300),
        ("seed", 2**64),
        ("mask_truncated_completions", 1),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        GRPOConfig(**{field: value})


def test_config_takes_numpy_numbers_as_python_ones() -> None:
    import numpy as np

    config = GRPOConfig(group_size=np.int64(4), learning_rate=np.float32(1e-3))
    assert (type(config.group_size), config.group_size) == (int, 4)
    assert type(config.learning_rate) is float and config.learning_rate == pytest.approx(1e-3)
    with pytest.raises(ValueError, match=r"weight_decay must be <= 1 / learning_rate = 100"):
        GRPOConfig(learning_rate=0.01, weight_decay=101.0)


def test_config_is_frozen_and_every_field_documented() -> None:
    import ast
    import inspect

    import agents.grpo_config as module

    with pytest.raises(dataclasses.FrozenInstanceError):
        GRPOConfig().beta = 1.0  # type: ignore[misc]
    body = ast.parse(inspect.getsource(module)).body
    cls = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == "GRPOConfig")
    documented = {
        stmt.target.id
        for stmt, nxt in zip(cls.body, cls.body[1:], strict=False)
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and isinstance(nxt, ast.Expr)
        and isinstance(nxt.value, ast.Constant)
    }
    assert documented == {f.name for f in dataclasses.fields(GRPOConfig)}


# -- update --------------------------------------------------------------------------------------------


def _batch(
    pop: TinyPopulation, adapter: str, group_size: int = 4
) -> tuple[list[str], list[str], list[float], list[int]]:
    prompts = [p for p in PROMPTS for _ in range(group_size)]
    completions = pop.generate(prompts, [adapter] * len(prompts), max_new_tokens=6, temperature=1.0, seed=1)
    rewards = [count_a(p, c) + 0.1 * i for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    groups = [i // group_size for i in range(len(prompts))]
    return prompts, completions, rewards, groups


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_only_the_named_adapter_moves(loss_type: LossType) -> None:
    pop = TinyPopulation()
    cfg = GRPOConfig(learning_rate=1e-2, loss_type=loss_type, max_new_tokens=6, beta=0.05, num_inner_epochs=2)
    learner = GRPOLearner(pop, cfg)
    before = snapshot(pop)
    stats = learner.update("p1", *_batch(pop, "p1"))
    assert not stats.skipped and stats.optimizer_steps == 2
    moved = changed(before, pop)
    adapter_b = {n for n, _ in pop.model.named_parameters() if ".p1." in n and "lora_" in n}
    assert moved, "the adapter did not change"
    assert moved <= adapter_b, f"parameters outside adapter 'p1' moved: {sorted(moved - adapter_b)[:3]}"
    # Requires-grad flags are restored after the update.
    assert all(not p.requires_grad for n, p in pop.model.named_parameters() if "lora_" not in n)


def test_no_cudnn_attention_turns_only_cudnn_off_only_on_cuda_and_restores_it() -> None:
    """The flag logic, on a CUDA device object (setting the flag needs no GPU): CPU blocks are left alone,
    the previous setting comes back after the block (also after an error), and a caller who already
    turned the backend off keeps it off."""
    enabled = torch.backends.cuda.cudnn_sdp_enabled
    assert enabled()
    with no_cudnn_attention(torch.device("cpu")):
        assert enabled()
    with no_cudnn_attention(torch.device("cuda")):
        assert not enabled()
    assert enabled()
    with pytest.raises(RuntimeError, match="inside"), no_cudnn_attention(torch.device("cuda")):
        raise RuntimeError("inside")
    assert enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        with no_cudnn_attention(torch.device("cuda")):
            assert not enabled()
        assert not enabled(), "a caller's own choice must survive the block"
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_every_forward_of_an_update_and_of_decoding_runs_outside_cudnn_attention(monkeypatch) -> None:
    """The wiring: the learner's forwards and ``decode_tokens``'s run inside ``no_cudnn_attention`` of
    the model's device (on a GPU that keeps SDPA off cuDNN, whose per-shape graph builds would otherwise be
    paid at nearly every call: key lengths grow by a token per step and batches change length)."""
    active: list[torch.device] = []

    @contextlib.contextmanager
    def spy(device: torch.device) -> Iterator[None]:
        active.append(device)
        try:
            with no_cudnn_attention(device):
                yield
        finally:
            active.pop()

    monkeypatch.setattr(agents.grpo, "no_cudnn_attention", spy)
    monkeypatch.setattr(agents.generation, "no_cudnn_attention", spy)
    pop = TinyPopulation()
    learner = GRPOLearner(pop, GRPOConfig(learning_rate=1e-2, max_new_tokens=6, beta=0.05))
    batch = _batch(pop, "p1")  # Hugging Face's generate: not ours, so before the hook
    devices: list[list[torch.device]] = []
    hook = pop.model.register_forward_pre_hook(lambda module, args: devices.append(list(active)))
    try:
        assert not learner.update("p1", *batch).skipped
        updates = len(devices)
        decode_tokens(pop.model, pop.tokenizer, ["ab", "b"], max_new_tokens=4, temperature=0.0, seed=0)
    finally:
        hook.remove()
    assert updates > 0 and len(devices) > updates
    assert all(d == [pop.device] for d in devices), devices


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_uneven_micro_batches_give_the_one_step_gradient(
    loss_type: LossType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of 3 in 2 accumulation steps (micro-batches of 2 and 1) must sum to the gradient of the
    whole batch in one step: each micro-batch weighted by its share of the sequences, not 1/2 each (which
    gave the lone sequence twice the weight of the others). bnpo normalises per micro-batch by definition."""
    pop = TinyPopulation()
    with torch.no_grad():
        for p in pop.trainable_parameters("p0"):
            p.normal_(0.0, 0.05)  # B != 0, so every LoRA factor gets a gradient
    prompts, completions, _, groups = _batch(pop, "p0", group_size=3)
    batch = (prompts[:3], completions[:3], [1.0, 0.0, 0.0], groups[:3])
    grads: dict[int, torch.Tensor] = {}
    clip = torch.nn.utils.clip_grad_norm_

    def spy(params: Any, *args: Any, **kwargs: Any) -> Any:
        params = list(params)
        grads[steps] = torch.cat([p.grad.flatten().clone() for p in params])
        return clip(params, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    before = snapshot(pop)
    for steps in (1, 2, 3):
        cfg = GRPOConfig(learning_rate=1e-2, loss_type=loss_type, max_new_tokens=6, grad_accum_steps=steps)
        assert not GRPOLearner(pop, cfg).update("p0", *batch).skipped
        with torch.no_grad():
            for name, p in pop.model.named_parameters():
                p.copy_(before[name])
    for steps in (2, 3):  # float32 rounding of other batch shapes only (the bug was 0.44 off)
        assert float((grads[steps] - grads[1]).norm() / grads[1].norm()) < 1e-4, steps


def test_token_caveats_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Text-only completions (EOS appended by a guess) and ids over the learner's cap (trained in part)
    are said once per learner, not silently."""
    pop = TinyPopulation()
    learner = GRPOLearner(pop, GRPOConfig(max_new_tokens=4))
    batch = _batch(pop, "p0")
    with caplog.at_level(logging.WARNING, logger="agents.grpo"):
        learner.update("p0", *batch)
        learner.update("p0", *batch)
    assert sum("without completion_ids" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()
    ids = [[5, 6, 7, 8, 9, 10]] + [[5, 2]] * (len(batch[0]) - 1)
    with caplog.at_level(logging.WARNING, logger="agents.grpo"):
        learner.update("p0", *batch, completion_ids=ids)
        learner.update("p0", *batch, completion_ids=ids)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("1 of 12 completions have more tokens than GRPOConfig.max_new_tokens=4 (longest 6)" in m
               for m in messages) == 1, messages  # fmt: skip


def test_an_update_past_the_trained_positions_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """A prompt longer than the model's max_position_embeddings trained silently where generation warned (a
    review): the update says so too, once per model."""
    pop = TinyPopulation()
    learner = GRPOLearner(pop, GRPOConfig(max_new_tokens=4))
    limit = pop.model.config.max_position_embeddings
    long_prompt = " ".join(["a"] * limit)
    with caplog.at_level(logging.WARNING, logger="agents.generation"):
        learner.update("p0", ["a b", "a b"], ["a", "b"], [1.0, 0.0], [0, 0])
        assert "max_position_embeddings" not in caplog.text
        for _ in range(2):
            learner.update("p0", [long_prompt] * 2, ["a", "b"], [1.0, 0.0], [0, 0])
    assert caplog.text.count(f"runs past the model's max_position_embeddings ({limit})") == 1


def test_first_inner_epoch_is_on_policy() -> None:
    pop = TinyPopulation()
    cfg = GRPOConfig(
        learning_rate=0.5,
        num_inner_epochs=1,
        grad_accum_steps=3,
        max_new_tokens=6,
        epsilon_low=0.0,
        epsilon_high=0.0,
    )
    learner = GRPOLearner(pop, cfg)
    batch = _batch(pop, "p0")
    # mu = 1: the ratio is exactly 1, so even a zero-width clip clips nothing.
    assert learner.update("p0", *batch).clip_fraction == 0.0

    # mu = 2 with stored old log-probs: the first epoch's ratio is exactly 1 too; the second, after a big
    # step, is not. Check the stored old log-probs against a fresh forward pass before any step.
    cfg2 = dataclasses.replace(cfg, num_inner_epochs=2)
    learner2 = GRPOLearner(pop, cfg2)
    enc = encode_batch(pop.tokenizer, batch[0], batch[1], None, cfg2.max_new_tokens)
    rows = [torch.arange(len(batch[0]))]
    pop.set_active("p0")
    old = learner2._no_grad_logps(enc, rows)[0]
    fresh = shared_prefix_logps(pop.model, pop.device, enc, rows[0], cfg2.temperature).detach()
    assert torch.equal(torch.exp(fresh - old), torch.ones_like(old))
    stats = learner2.update("p0", *batch)
    assert stats.optimizer_steps == 2 and stats.clip_fraction > 0.0


def test_log_probs_match_an_unpadded_full_forward() -> None:
    # The learner pads, shares each prompt's prefix across its group and gathers the KV cache; a plain
    # forward of each full sequence on its own must give the same per-token log-probs.
    pop = TinyPopulation()
    with torch.no_grad():
        for p in pop.trainable_parameters("p0"):
            p.normal_(0.0, 0.1)  # a non-trivial adapter, so the LoRA path is exercised
    learner = GRPOLearner(pop, GRPOConfig(max_new_tokens=6, temperature=0.7))
    prompts, completions, _, _ = _batch(pop, "p0", group_size=3)
    completions[0] = ""  # an empty completion still trains its EOS
    pop.set_active("p0")
    batch = encode_batch(pop.tokenizer, prompts, completions, None, learner.config.max_new_tokens)
    with torch.no_grad():
        got = shared_prefix_logps(pop.model, pop.device, batch, torch.arange(len(prompts)), 0.7)
    tok = pop.tokenizer
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        p_ids = tok(prompt)["input_ids"]
        c_ids = tok(completion, add_special_tokens=False)["input_ids"][:6]
        c_ids = [*c_ids, tok.eos_token_id] if len(c_ids) < 6 else c_ids
        with torch.no_grad():
            logits = pop.model(input_ids=torch.tensor([p_ids + c_ids])).logits[0] / 0.7
        expected = [
            torch.log_softmax(logits[len(p_ids) - 1 + t], dim=-1)[c].item() for t, c in enumerate(c_ids)
        ]
        assert got[i, : len(c_ids)].tolist() == pytest.approx(expected, abs=1e-5)
        assert batch.completion_mask[i].sum().item() == len(c_ids)


def test_kl_to_base_is_zero_for_a_fresh_adapter_then_grows() -> None:
    # A fresh LoRA adapter has B = 0, so it *is* the base (the reference): k3 KL is exactly 0 until it moves.
    pop = TinyPopulation()
    learner = GRPOLearner(pop, GRPOConfig(learning_rate=5e-2, beta=0.1, max_new_tokens=6))
    batch = _batch(pop, "p0")
    first = learner.update("p0", *batch)
    second = learner.update("p0", *batch)
    assert first.kl == 0.0
    assert second.kl is not None and second.kl > 0.0
    # the penalty is in the optimised loss: the same two updates without it give another second loss
    # and other weights (the first ones agree: at zero divergence the k3 KL and its gradient are 0)
    twin = TinyPopulation()
    unpenalised = GRPOLearner(twin, GRPOConfig(learning_rate=5e-2, beta=0.0, max_new_tokens=6))
    assert unpenalised.update("p0", *batch).loss == pytest.approx(first.loss)
    assert abs(unpenalised.update("p0", *batch).loss - second.loss) > 1e-6
    assert changed(snapshot(pop), twin)


def test_adapters_keep_separate_optimizer_state() -> None:
    pop = TinyPopulation()
    learner = GRPOLearner(pop, GRPOConfig(learning_rate=1e-2, max_new_tokens=6))
    learner.update("p0", *_batch(pop, "p0"))
    learner.update("p1", *_batch(pop, "p1"))
    opt_a, opt_b = learner.optimizer_for("p0"), learner.optimizer_for("p1")
    assert opt_a is not opt_b
    ids_a = {id(p) for g in opt_a.param_groups for p in g["params"]}
    ids_b = {id(p) for g in opt_b.param_groups for p in g["params"]}
    assert ids_a.isdisjoint(ids_b) and ids_a == {id(p) for p in pop.trainable_parameters("p0")}
    assert all(opt_a.state[p]["step"] == 1 for p in pop.trainable_parameters("p0"))


def test_task_relative_needs_keys_and_runs_with_them() -> None:
    pop = TinyPopulation()
    learner = GRPOLearner(
        pop, GRPOConfig(learning_rate=1e-2, scale_rewards="task_relative", max_new_tokens=6)
    )
    prompts, completions, rewards, groups = _batch(pop, "p0")
    with pytest.raises(ValueError, match="task_keys"):
        learner.update("p0", prompts, completions, rewards, groups)
    keys = [("student", "deduction") if g % 2 else ("teacher", "abduction") for g in groups]
    stats = learner.update("p0", prompts, completions, rewards, groups, task_keys=keys)
    assert not stats.skipped
    # the advantages are the task-relative ones: the same update with group advantages, from the same
    # weights, moves them elsewhere (the two normalisations differ on this batch)
    twin = TinyPopulation()
    GRPOLearner(twin, GRPOConfig(learning_rate=1e-2, max_new_tokens=6)).update(
        "p0", prompts, completions, rewards, groups
    )
    assert changed(snapshot(pop), twin)


def test_bad_inputs() -> None:
    pop = TinyPopulation()
    learner = GRPOLearner(pop, GRPOConfig(max_new_tokens=6))
    with pytest.raises(KeyError, match="'p0', 'p1'"):
        learner.update("nope", ["x"], ["y"], [1.0], [0])
    with pytest.raises(ValueError, match="lengths prompts 2, completions 1, rewards 1, group_ids 1"):
        learner.update("p0", ["x", "x"], ["y"], [1.0], [0])
    with pytest.raises(ValueError, match="task_keys 1"):
        learner.update("p0", ["x", "x"], ["y", "z"], [1.0, 0.0], [0, 0], task_keys=[("s", "d")])
    with pytest.raises(TypeError, match="prompts must be a sequence"):
        learner.update("p0", "xy", ["y", "z"], [1.0, 0.0], [0, 0])
    with pytest.raises(TypeError, match="prompts must be a sequence"):
        learner.step("p0", "xy", lambda p, c: 1.0)
    # (a review: a dict of rewards was read by its keys, reversing the advantages; strings were taken; a
    # list as a group id was a bare TypeError)
    with pytest.raises(
        TypeError, match="rewards must be a sequence with one entry per completion, not a dict"
    ):
        learner.update("p0", ["x", "x"], ["y", "z"], {0: 1.0, 1: 0.0}, [0, 0])
    with pytest.raises(TypeError, match=r"rewards must be a sequence .* not a generator"):
        learner.update("p0", ["x", "x"], ["y", "z"], (r for r in (1.0, 0.0)), [0, 0])
    with pytest.raises(TypeError, match=r"rewards\[0\] must be a number, got a str: '1'"):
        learner.update("p0", ["x", "x"], ["y", "z"], ["1", "0"], [0, 0])
    with pytest.raises(TypeError, match=r"group_ids\[0\] must be hashable"):
        learner.update("p0", ["x", "x"], ["y", "z"], [1.0, 0.0], [[0], [0]])
    vocabulary = len(pop.tokenizer)
    for bad in ([vocabulary], [-1], [2.0], [True]):
        with pytest.raises(
            ValueError, match=rf"completion_ids\[1\] must hold token ids, ints in \[0, {vocabulary}\)"
        ):
            learner.update("p0", ["x", "x"], ["y", "z"], [1.0, 0.0], [0, 0], completion_ids=[[5], bad])


# -- truncated completions (DAPO's overlong filtering) ---------------------------------------------------

EOS = 2  # TinyPopulation's tokenizer: "</s>"
# ids of a group of four on one prompt: two stopped on EOS, two cut at the budget of 4 tokens
STOPPED, CUT = ([5, 6, EOS], [7, EOS]), ([8, 9, 10, 11], [12, 5, 6, 7])


def _masked_update(
    pop: TinyPopulation, mask: bool, cut: tuple[list[int], ...] = CUT, loss_type: LossType = "dapo"
) -> UpdateStats:
    cfg = GRPOConfig(
        learning_rate=1e-2, max_new_tokens=4, loss_type=loss_type, mask_truncated_completions=mask
    )
    ids = [*STOPPED, *cut]
    return GRPOLearner(pop, cfg).update(
        "p0", ["abc "] * 4, ["x"] * 4, [1.0, 0.0, 0.5, -1.0], [0] * 4, completion_ids=ids
    )


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_masked_truncated_completions_take_no_part_in_the_loss(loss_type: LossType) -> None:
    """With the option on, what a cut-off completion says does not move the adapter (its reward still
    shapes the others' advantages); with it off, it does. Both count it in ``num_truncated``."""
    results = {}
    for mask in (True, False):
        for cut in (CUT, ([13, 14, 15, 16], [17, 18, 19, 20])):
            pop = TinyPopulation()
            generator = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in pop.trainable_parameters("p0"):
                    p.normal_(0.0, 0.05, generator=generator)  # B != 0: every factor gets a gradient
            stats = _masked_update(pop, mask, cut, loss_type)
            assert not stats.skipped and stats.num_truncated == 2
            assert stats.num_tokens == (5 if mask else 13)  # 3 + 2 stopped tokens, + 4 + 4 cut ones
            results[mask, cut[0][0]] = snapshot(pop)

    def differ(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> set[str]:
        return {name for name in a if not torch.equal(a[name], b[name])}

    assert differ(results[True, 8], results[True, 13]) == set()
    assert differ(results[False, 8], results[False, 13])


def test_a_batch_of_nothing_but_truncated_completions_is_skipped_when_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pop = TinyPopulation()
    before = snapshot(pop)
    cfg = GRPOConfig(learning_rate=1e-2, max_new_tokens=4, mask_truncated_completions=True)
    with caplog.at_level(logging.WARNING, logger="agents.grpo"):
        stats = GRPOLearner(pop, cfg).update(
            "p0", ["abc "] * 2, ["x"] * 2, [1.0, 0.0], [0, 0], completion_ids=CUT
        )
    assert stats.skipped and stats.skip_reason == "all_truncated" and stats.num_truncated == 2
    assert "all 2 completions hold no stop token" in caplog.text
    assert changed(before, pop) == set()
    unmasked = dataclasses.replace(cfg, mask_truncated_completions=False)
    stats = GRPOLearner(pop, unmasked).update(
        "p0", ["abc "] * 2, ["x"] * 2, [1.0, 0.0], [0, 0], completion_ids=CUT
    )
    assert not stats.skipped and stats.num_truncated == 2 and changed(before, pop)


def test_the_cut_off_completions_are_named_and_counted_by_role() -> None:
    """``truncated_rows`` names which completions were cut, so PBT's figures count them by role: a self-play
    member's batch holds teachers' and students' answers, and the teachers' share is the sharper signal."""
    from agents.members import grpo_info

    pop = TinyPopulation()
    ids = [STOPPED[0], CUT[0], STOPPED[1], CUT[1], CUT[0]]
    stats = GRPOLearner(pop, GRPOConfig(learning_rate=1e-2, max_new_tokens=4)).update(
        "p0", ["abc "] * 5, ["x"] * 5, [1.0, 0.0, 0.5, -1.0, 0.2], [0] * 5, completion_ids=ids
    )
    assert stats.truncated_rows == (1, 3, 4) and stats.num_truncated == 3
    info = grpo_info(stats, ["teacher", "student", "student", "teacher", "teacher"])
    by_role = [
        info[f"{count}_{role}"] for role in ("teacher", "student") for count in ("completions", "truncated")
    ]
    assert by_role == [3.0, 2.0, 2.0, 1.0] and info["truncated"] == 3.0 and info["completions"] == 5.0
    assert "completions_teacher" not in grpo_info(stats)  # (no roles given: counted in all only)
    with pytest.raises(ValueError, match="roles: one per completion, got 2 for 5"):
        grpo_info(stats, ["teacher", "student"])
    masked = GRPOConfig(learning_rate=1e-2, max_new_tokens=4, mask_truncated_completions=True)
    skipped = GRPOLearner(pop, masked).update(
        "p0", ["abc "] * 2, ["x"] * 2, [1.0, 0.0], [0, 0], completion_ids=CUT
    )
    assert skipped.skipped and skipped.truncated_rows == (0, 1)
    assert grpo_info(skipped, ["student", "student"])["truncated_student"] == 2.0


def test_text_completions_at_the_budget_count_as_truncated() -> None:
    """Without ids, a text that re-tokenises to the budget gets no EOS appended: it was cut."""
    pop = TinyPopulation()
    cfg = GRPOConfig(learning_rate=1e-2, max_new_tokens=4, mask_truncated_completions=True)
    stats = GRPOLearner(pop, cfg).update(
        "p0", ["abc "] * 3, ["ab", "abcd", "abcdef"], [1.0, 0.0, 0.5], [0] * 3
    )
    assert stats.num_truncated == 2 and stats.num_tokens == 3  # "ab" + EOS


def test_a_tokenizer_without_eos_counts_every_completion_as_truncated() -> None:
    """Nothing stops generation without a stop id (neither the tokenizer's EOS nor the model's generation
    config): every completion was cut, and the update still runs."""
    pop = TinyPopulation()
    pop.tokenizer.eos_token = None
    pop.model.generation_config.eos_token_id = None
    assert pop.tokenizer.eos_token_id is None
    stats = GRPOLearner(pop, GRPOConfig(learning_rate=1e-2, max_new_tokens=4)).update(
        "p0", ["abc "] * 4, ["x"] * 4, [1.0, 0.0, 0.5, -1.0], [0] * 4, completion_ids=[*STOPPED, *CUT]
    )
    assert not stats.skipped and stats.num_truncated == 4


def test_padding_is_not_read_as_a_stop_token() -> None:
    """Many tokenizers pad with their EOS: a cut row padded with it is still cut."""
    ids = torch.tensor([[5, 6, EOS, EOS], [5, 6, 7, EOS], [5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]).float()
    batch = TokenBatch(torch.ones(1, 1), torch.ones(1, 1), torch.zeros(3, dtype=torch.long), ids, mask)
    assert truncated_rows(batch, [EOS]).tolist() == [False, True, True]
    assert truncated_rows(batch, [EOS, 8]).tolist() == [False, True, False]  # any of the stop ids


# -- non-finite values ---------------------------------------------------------------------------------


def test_nan_reward_skips_and_leaves_adapter_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    pop = TinyPopulation()
    learner = GRPOLearner(pop, GRPOConfig(learning_rate=1e-2, max_new_tokens=6))
    prompts, completions, rewards, groups = _batch(pop, "p0")
    rewards[3] = float("nan")
    before = snapshot(pop)
    with caplog.at_level(logging.WARNING, logger="agents.grpo"):
        stats = learner.update("p0", prompts, completions, rewards, groups)
    assert stats.skipped and stats.skip_reason == "non_finite_reward" and stats.optimizer_steps == 0
    assert "reward[3]" in caplog.text and "skipped" in caplog.text
    assert changed(before, pop) == set()
    # not tokenised: how many were cut off is unknown, and PBT's cut share must not count them as whole (a review)
    from agents.members import grpo_info
    from evolve.runlog import truncated_share

    assert stats.num_truncated is None and "truncated" not in grpo_info(stats)
    assert truncated_share({"0": grpo_info(stats), "1": {"truncated": 2.0, "completions": 2.0}}) == 1.0


def test_nan_logit_in_second_epoch_rolls_back_the_first(caplog: pytest.LogCaptureFixture) -> None:
    pop = TinyPopulation()
    learner = GRPOLearner(pop, GRPOConfig(learning_rate=1e-2, num_inner_epochs=3, max_new_tokens=6))
    batch = _batch(pop, "p0")
    learner.update("p0", *batch)  # give the optimizer some state worth protecting
    state_before = {
        k: v.clone() for k, v in learner.optimizer_for("p0").state[pop.trainable_parameters("p0")[0]].items()
    }
    before = snapshot(pop)

    calls = {"n": 0}
    # The learner runs lm_head twice per log-prob pass (shared prompt prefix, then completions):
    # calls 1-2 = old log-probs, 3-4 = epoch 0 (then an optimizer step), 5-6 = epoch 1 -> NaN logits.
    first_poisoned = 5

    def poison(module: torch.nn.Module, args: tuple[object, ...], output: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return output if calls["n"] < first_poisoned else torch.full_like(output, float("nan"))

    handle = pop.model.get_base_model().lm_head.register_forward_hook(poison)
    try:
        with caplog.at_level(logging.WARNING, logger="agents.grpo"):
            stats = learner.update("p0", *batch)
    finally:
        handle.remove()
    assert stats.skipped and stats.skip_reason == "non_finite_loss"
    assert "inner epoch 1" in caplog.text
    assert changed(before, pop) == set()
    state_after = learner.optimizer_for("p0").state[pop.trainable_parameters("p0")[0]]
    assert all(torch.equal(state_before[k], state_after[k]) for k in state_before)


def test_a_step_that_leaves_non_finite_weights_is_rolled_back(caplog: pytest.LogCaptureFixture) -> None:
    """Finite gradients and a learning rate within float32's range can still step the weights past it: the
    update was reported as done with infinite weights (a review). It is skipped, weights and optimizer state
    as they were, also with one inner epoch (which takes no copy for other reasons)."""
    pop = TinyPopulation()
    learner = GRPOLearner(pop, GRPOConfig(learning_rate=1e38, max_new_tokens=6))
    batch = _batch(pop, "p0")
    before = snapshot(pop)
    with caplog.at_level(logging.WARNING, logger="agents.grpo"):  # the step size lr / (1 - 0.9) overflows
        stats = learner.update("p0", *batch)
    assert stats.skipped and stats.skip_reason == "non_finite_weights", stats
    assert "the optimizer step of inner epoch 0 overflowed" in caplog.text
    assert changed(before, pop) == set()
    assert learner.optimizer_for("p0").state == {}  # (AdamW had counted a step for some parameters)

    learner = GRPOLearner(pop, GRPOConfig(learning_rate=1e-2, max_new_tokens=6))
    optimizer = learner.optimizer_for("p0")
    real_step = optimizer.step

    def diverging_step(*args: Any, **kwargs: Any) -> Any:  # a step that leaves an infinite weight
        result = real_step(*args, **kwargs)
        with torch.no_grad():
            pop.trainable_parameters("p0")[0].view(-1)[0] = float("inf")
        return result

    optimizer.step = diverging_step  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="agents.grpo"):
        stats = learner.update("p0", *batch)
    assert (
        stats.skip_reason == "non_finite_weights"
        and "after the optimizer step of inner epoch 0 (trainable tensor 0)" in caplog.text
    )
    assert changed(before, pop) == set()


# -- learning ------------------------------------------------------------------------------------------


def _mean_reward(pop: TinyPopulation, adapter: str, seed: int) -> float:
    prompts = [p for p in PROMPTS for _ in range(16)]
    texts = pop.generate(prompts, [adapter] * len(prompts), max_new_tokens=8, temperature=1.0, seed=seed)
    return sum(count_a(p, t) for p, t in zip(prompts, texts, strict=True)) / len(texts)


def test_short_run_raises_mean_reward() -> None:
    pop = TinyPopulation(seed=0)
    cfg = GRPOConfig(learning_rate=1e-2, group_size=8, max_new_tokens=8, loss_type="dapo", seed=0)
    learner = GRPOLearner(pop, cfg)
    base = {n: p.detach().clone() for n, p in pop.model.named_parameters() if "lora_" not in n}
    start = _mean_reward(pop, "p0", seed=1234)
    history: list[UpdateStats] = [learner.step("p0", PROMPTS, count_a).stats for _ in range(6)]
    end = _mean_reward(pop, "p0", seed=1234)
    assert not any(s.skipped for s in history)
    assert end >= start + 0.5, f"mean reward {start:.3f} -> {end:.3f}"
    assert all(torch.equal(p.detach(), base[n]) for n, p in pop.model.named_parameters() if "lora_" not in n)
    assert _mean_reward(pop, "p1", seed=1234) == pytest.approx(start)  # the other adapter did not move


# -- the real population ---------------------------------------------------------------------------------


def test_with_lora_population(tiny_base_dir: Any) -> None:
    # The learner against agents.population.LoRAPopulation on the tiny pretrained base (BPE tokenizer).
    from agents.population import LoRAPopulation

    pop = LoRAPopulation.from_pretrained(tiny_base_dir, names=["teacher_0", "student_0"], rank=4)
    learner = GRPOLearner(pop, GRPOConfig(learning_rate=1e-2, group_size=4, max_new_tokens=8, beta=0.01))
    before = {n: p.detach().clone() for n, p in pop.model.named_parameters()}
    result = learner.step(
        "student_0", ["def f(x):\n    return", "```python\n"], lambda p, c: float(len(c) % 3)
    )
    assert len(result.completions) == 8 and not result.stats.skipped and result.stats.kl is not None
    moved = {n for n, p in pop.model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert moved and all(".student_0." in n for n in moved)
    # The population's own invariants still hold afterwards: every adapter trainable, base frozen.
    flags = {n: p.requires_grad for n, p in pop.model.named_parameters()}
    assert all(flags[n] == ("lora_" in n) for n in flags)


def test_step_trains_on_the_generated_token_ids(tiny_base_dir: Any) -> None:
    # LoRAPopulation hands the learner the sampled ids; a non-canonical BPE split must survive the update.
    from agents.generation import texts_of
    from agents.population import LoRAPopulation

    pop = LoRAPopulation.from_pretrained(tiny_base_dir, names=["p0"], rank=4)
    cfg = GRPOConfig(learning_rate=1e-3, group_size=4, max_new_tokens=8, seed=3)
    prompts = ["def f(x):\n    return", "```python\n"]
    expanded = [p for p in prompts for _ in range(cfg.group_size)]
    ids = pop.generate_tokens(expanded, ["p0"] * len(expanded), 8, 1.0, seed=3)  # step 0 uses cfg.seed
    result = GRPOLearner(pop, cfg).step("p0", prompts, lambda p, c: float(len(c) % 3))
    assert result.completions == tuple(texts_of(pop.tokenizer, ids))
    assert result.stats.num_tokens == sum(len(row) for row in ids)

    word = "return"
    canonical = pop.tokenizer(word, add_special_tokens=False)["input_ids"]
    chars = pop.tokenizer.convert_tokens_to_ids(list(word))
    assert len(canonical) < len(chars)  # the tiny BPE merges the word
    learner = GRPOLearner(pop, cfg)
    eos = pop.tokenizer.eos_token_id
    as_ids = learner.update(
        "p0", [prompts[0]] * 2, [word] * 2, [0.0, 1.0], [0, 0], completion_ids=[chars, [*chars, eos]]
    )
    as_text = learner.update("p0", [prompts[0]] * 2, [word] * 2, [0.0, 1.0], [0, 0])
    assert as_ids.num_tokens == 2 * len(chars) + 1
    assert as_text.num_tokens == 2 * (len(canonical) + 1)  # re-tokenised, EOS appended
    with pytest.raises(ValueError, match="completion_ids"):
        learner.update("p0", [prompts[0]], [word], [1.0], [0], completion_ids=[[]])


def test_a_step_that_raises_can_be_retried_with_the_same_samples(tiny_base_dir: Any) -> None:
    """The default seed counts the steps that returned: a reward function that raised (or a refused
    update) leaves it, so the retried step samples what the failed one sampled."""
    from agents.population import LoRAPopulation

    pop = LoRAPopulation.from_pretrained(tiny_base_dir, names=["p0"], rank=4)
    learner = GRPOLearner(pop, GRPOConfig(learning_rate=1e-3, group_size=2, max_new_tokens=6, seed=3))
    seen: list[tuple[str, ...]] = []

    def failing(prompt: str, completion: str) -> float:
        seen.append((prompt, completion))
        raise RuntimeError("verifier down")

    with pytest.raises(RuntimeError, match="verifier down"):
        learner.step("p0", ["def f(x):\n    return"], failing)
    result = learner.step("p0", ["def f(x):\n    return"], lambda p, c: float(len(c) % 2))
    assert result.completions[0] == seen[0][1]


def test_special_token_text_in_a_prompt_stays_text(tiny_base_dir: Any) -> None:
    """A teacher's task is shown to students: its text "</s><pad>" was tokenised as the EOS and pad
    tokens inside every matched student's prompt (an injection surface), in generation and learner alike."""
    from agents.base import load_base
    from agents.generation import decode_tokens

    model, tokenizer = load_base(tiny_base_dir, dtype=torch.float32, device="cpu")
    prompt = "f('</s><pad>') == "
    batch = encode_batch(tokenizer, [prompt], ["x"], None, max_new_tokens=4)
    real = batch.prompt_ids[batch.prompt_mask.bool()].tolist()
    assert real[0] == tokenizer.bos_token_id
    assert tokenizer.eos_token_id not in real[1:] and tokenizer.pad_token_id not in real[1:]
    assert tokenizer.decode(real, skip_special_tokens=True) == prompt
    seen: list[torch.Tensor] = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs.get("input_ids")), with_kwargs=True
    )
    try:
        decode_tokens(model, tokenizer, [prompt], max_new_tokens=1, temperature=0.0, seed=0)
    finally:
        hook.remove()
    assert seen[0][0].tolist() == real  # generation saw the same ids as the learner


def test_update_stats_are_token_means_whatever_the_micro_batches() -> None:
    """``kl`` and ``clip_fraction`` are means over the active tokens: they were means of per-micro-batch
    means, so the same update (same loss and gradient) reported other values for another
    ``grad_accum_steps`` when micro-batches held different numbers of tokens."""
    pop = TinyPopulation()
    with torch.no_grad():
        for p in pop.trainable_parameters("p0"):
            p.normal_(0.0, 0.2)  # away from the base: a KL to report
    prompts, completions, _, groups = _batch(pop, "p0", group_size=3)
    completions = [completions[0][:6], completions[1][:1], completions[2][:1]]
    batch = (prompts[:3], completions, [1.0, 0.0, 0.5], groups[:3])
    before = snapshot(pop)
    stats = []
    for steps in (1, 3):
        cfg = GRPOConfig(learning_rate=0.05, beta=0.1, max_new_tokens=6, grad_accum_steps=steps,
                         num_inner_epochs=2, epsilon_low=0.01, epsilon_high=0.01)  # fmt: skip
        stats.append(GRPOLearner(pop, cfg).update("p0", *batch))
        with torch.no_grad():
            for name, p in pop.model.named_parameters():
                p.copy_(before[name])
    one, three = stats
    assert one.loss == pytest.approx(three.loss, rel=1e-5) and one.kl is not None and one.kl > 0
    assert three.kl == pytest.approx(one.kl, rel=1e-5)
    assert one.clip_fraction > 0 and three.clip_fraction == pytest.approx(one.clip_fraction, rel=1e-5)


def test_a_group_of_equal_rewards_gets_no_advantage_at_any_scale() -> None:
    """Equal rewards carry no signal: their advantages are 0 (float32 statistics gave every sample of a
    group paid 100.3 an advantage of 0.07, all of one sign), and with no KL term the gradient is 0."""
    pop = TinyPopulation()
    prompts, completions, _, groups = _batch(pop, "p0", group_size=3)  # 4 equal float32s average exactly
    for reward in (0.7, 100.3, 1000.1):
        stats = GRPOLearner(pop, GRPOConfig(learning_rate=1e-2, max_new_tokens=6)).update(
            "p0", prompts, completions, [reward] * len(prompts), groups
        )
        assert not stats.skipped and stats.grad_norm == 0.0, (reward, stats)
    # rewards past float32's range are statistics in float64: 1e39 was refused as infinite, and the std
    # of 1e20 and -1e20 overflowed to give every sample an advantage of 0
    # and the squares of +-1e154 overflowed float64 too (a robustness review): advantages past any scale
    for large in ([1e39, 0.0, 0.0], [1e20, -1e20, 0.0], [1e154, -1e154, 0.0], [1.7e308, 1e308, 0.0]):
        stats = GRPOLearner(pop, GRPOConfig(learning_rate=1e-2, max_new_tokens=6)).update(
            "p0", prompts, completions, large * 3, groups
        )
        assert not stats.skipped and stats.grad_norm > 0.0, (large, stats)
