"""LoRA population: base loading, genomes, batched mixed-adapter generation, save/load, bad input."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from agents import base as base_module  # noqa: E402
from agents import population as population_module  # noqa: E402
from agents.base import BaseModelLoadError, TinyBaseConfig, build_tiny_base, load_base, tiny_base_key  # noqa: E402
from agents.batched_lora import lora_linear_layers, stacked_lora  # noqa: E402
from agents.corpus import EXAMPLE_KINDS, generate_examples  # noqa: E402
from agents.generation import decode, filter_top_p, share_rows  # noqa: E402
from agents.population import LoRAPopulation  # noqa: E402
from tests.agents_fixtures import one_torch_thread, tiny_base_dir  # noqa: E402

__all__ = ["one_torch_thread", "tiny_base_dir"]  # fixtures are used by name
pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAMES = ["teacher_0", "student_0", "student_1"]


def randomize_b(pop: LoRAPopulation, name: str, seed: int, scale: float = 0.5) -> None:
    """Give an adapter a non-zero ``lora_B`` so that it really differs from the base and the others."""
    generator = torch.Generator().manual_seed(seed)
    genome = pop.get_genome(name)
    for key, value in genome.items():
        if ".lora_B." in key:
            genome[key] = torch.randn(value.shape, generator=generator) * scale
    pop.set_genome(name, genome)


@pytest.fixture(scope="module")
def pop(tiny_base_dir: Path) -> LoRAPopulation:
    population = LoRAPopulation.from_pretrained(
        tiny_base_dir, NAMES, rank=4, target_modules="all-linear", dtype=torch.float32, device="cpu"
    )
    for i, name in enumerate(NAMES):
        randomize_b(population, name, seed=100 + i)
    return population


def prompts(n: int, seed: int = 7) -> list[str]:
    return [example.prompt for example in generate_examples(n, seed)]


def logits_of(pop: LoRAPopulation, texts: list[str]) -> torch.Tensor:
    enc = pop.tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        return pop.model(**enc).logits


# --------------------------------------------------------------------------------------------------------
# Corpus and base
# --------------------------------------------------------------------------------------------------------
def test_corpus_is_deterministic_and_parses_in_the_env_format() -> None:
    from populora_env.text_format import FormatError, parse_answer, parse_proposal

    first, again, other = generate_examples(24, 3), generate_examples(24, 3), generate_examples(24, 4)
    assert first == again
    assert first != other
    assert {e.kind for e in first} == set(EXAMPLE_KINDS)
    for example in first:
        role, task_type = example.kind.split("_")
        parse = parse_proposal if role == "propose" else parse_answer
        parsed = parse(example.answer, task_type, max_chars=4000)  # type: ignore[operator]
        assert not isinstance(parsed, FormatError), (example.kind, parsed)
        if role == "propose":
            program = parsed.program  # type: ignore[union-attr]
        elif task_type == "induction":
            program = parsed.text  # type: ignore[union-attr]
        else:
            program = example.prompt.split("```python\n")[1].split("```")[0]
        assert "def f(x):" in program
        ast.parse(program)  # every program is valid Python


def test_tiny_base_loads_frozen_with_left_padding(tiny_base_dir: Path) -> None:
    model, tokenizer = load_base(tiny_base_dir, device="cpu")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    assert not any(p.requires_grad for p in model.parameters())
    assert type(model).__name__ == "LlamaForCausalLM"
    text = generate_examples(1, 0)[0].text
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text  # byte-level BPE round-trips exactly


def test_build_tiny_base_reuses_cache_and_cleans_stale_builds(tmp_path: Path) -> None:
    config = TinyBaseConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                            max_position_embeddings=128, corpus_documents=40, seq_len=64, batch_size=2, steps=2,
                            warmup_steps=1)  # fmt: skip
    key = tiny_base_key(config)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".tmp-{key}-{int(dead.stdout)}-leftover"  # a build killed before its rename
    stale.mkdir()
    built = build_tiny_base(tmp_path, config, progress=False, num_threads=1)
    assert built.name == f"tiny-base-{key}" and (built / "config.json").is_file()
    assert not stale.exists()
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_base(tmp_path, config, progress=False) == built
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert tiny_base_key(TinyBaseConfig(steps=30)) != tiny_base_key(TinyBaseConfig(steps=40))
    # damaged after its build (truncated weights, a lost tokenizer): built again, not served as it is
    # (it failed every later load, and the error's advice led back to the same folder)
    weights = built / "model.safetensors"
    whole = weights.read_bytes()  # (a build is byte-identical at one thread)

    # and (a robustness review) a tokenizer_config.json that is not JSON, a config.json of `{}`, a file or a
    # link to nothing in the base's place: taken for whole, or a whole build failed to rename onto the link
    # and left a file behind
    def replaced(make: Any) -> None:
        shutil.rmtree(built)
        make()

    for damage in (lambda: weights.write_bytes(weights.read_bytes()[:1000]),
                   lambda: (built / "tokenizer.json").unlink(),
                   lambda: (built / "tokenizer_config.json").write_text("not json"),
                   lambda: (built / "config.json").write_text("{}"),
                   lambda: replaced(lambda: built.write_text("a file")),
                   lambda: replaced(lambda: built.symlink_to(tmp_path / "nowhere")),
                   # weights whose header still parses, the values changed (NaN trained on; an audit)
                   lambda: weights.write_bytes(weights.read_bytes()[:-64] + b"\xff" * 64)):  # fmt: skip
        damage()
        assert build_tiny_base(tmp_path, config, progress=False, num_threads=1) == built
        load_base(built)  # whole again
        assert weights.read_bytes() == whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [built.name]
    weights.write_bytes(weights.read_bytes()[:-8])  # what only loading finds: the message says what to do
    with pytest.raises(BaseModelLoadError, match="delete that folder") as info:
        load_base(built)
    assert "HF_HUB" not in str(info.value)


def test_a_second_build_waits_for_the_first_and_takes_its_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two first runs on a fresh machine each pretrained the same base for minutes (a review): a build waits
    for the one holding the cache (an ``flock`` on the cache folder), says so, and returns the base that one
    made without building it again."""
    import fcntl
    import threading

    config = TinyBaseConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                            max_position_embeddings=128, corpus_documents=40, seq_len=64, batch_size=2, steps=2,
                            warmup_steps=1)  # fmt: skip
    made = build_tiny_base(tmp_path / "elsewhere", config, progress=False, num_threads=1)
    cache = tmp_path / "cache"
    cache.mkdir()
    holder = os.open(cache, os.O_RDONLY)  # the other builder
    fcntl.flock(holder, fcntl.LOCK_EX)
    waiting = threading.Event()
    real_warning = base_module.logger.warning

    def warning(message: str, *args: Any) -> None:
        real_warning(message, *args)
        if "waiting for it to finish" in message:
            waiting.set()

    def finish_the_other_build() -> None:
        assert waiting.wait(60), "the second build did not wait"
        shutil.copytree(made, cache / made.name)
        os.close(holder)

    def build_again(*args: Any) -> None:
        raise AssertionError("built a base the other process had built")

    monkeypatch.setattr(base_module.logger, "warning", warning)
    monkeypatch.setattr(base_module, "_build_into", build_again)
    other = threading.Thread(target=finish_the_other_build)
    other.start()
    try:
        assert build_tiny_base(cache, config, progress=False) == cache / made.name
    finally:
        other.join()
    assert waiting.is_set() and sorted(p.name for p in cache.iterdir()) == [made.name]


def test_interrupted_build_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = TinyBaseConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                            corpus_documents=40, seq_len=64, batch_size=2, steps=2, warmup_steps=1)  # fmt: skip

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(base_module, "_pretrain", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_tiny_base(tmp_path, config, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("field", "value"), [("vocab_size", 10), ("num_heads", 3), ("steps", 0), ("learning_rate", float("nan"))]
)
def test_tiny_base_config_rejects_bad_fields(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        TinyBaseConfig(**{field: value})


def test_missing_base_is_one_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(BaseModelLoadError, match="no-such-model") as info:
        load_base(missing)
    assert "HF_HUB_OFFLINE" in str(info.value)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(BaseModelLoadError, match="broken"):
        LoRAPopulation.from_pretrained(broken, ["a"])


def test_a_cached_base_that_fails_to_load_is_called_damaged_only_when_it_is(
    tiny_base_dir: Path, tmp_path: Path
) -> None:
    """A whole tiny base that the installed transformers cannot load (one older than the package needs)
    was said to be damaged, to be deleted and rebuilt: which fails the same way."""

    whole = tmp_path / "whole"
    shutil.copytree(tiny_base_dir, whole)
    config = json.loads((whole / "config.json").read_text())
    (whole / "config.json").write_text(json.dumps({**config, "model_type": "no-such-architecture"}))
    with pytest.raises(BaseModelLoadError) as info:
        load_base(whole)
    assert "files are whole" in str(info.value) and "damaged" not in str(info.value)
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_base_dir, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(BaseModelLoadError, match=r"damaged after its build \(.*\): delete that folder"):
        load_base(damaged)


# --------------------------------------------------------------------------------------------------------
# Adapters and genomes
# --------------------------------------------------------------------------------------------------------
def test_genome_is_peft_state_dict_and_base_is_shared(pop: LoRAPopulation) -> None:
    from peft import get_peft_model_state_dict

    for name in NAMES:
        genome = pop.get_genome(name)
        reference = get_peft_model_state_dict(pop.model, adapter_name=name)
        assert genome.keys() == reference.keys() and genome
        assert all(torch.equal(genome[k], reference[k]) for k in genome)
        for key, value in genome.items():
            layer = pop.model.get_submodule(key.removesuffix(".lora_A.weight").removesuffix(".lora_B.weight"))
            expected = (4, layer.in_features) if ".lora_A." in key else (layer.out_features, 4)
            assert tuple(value.shape) == expected
    base_model, _ = load_base(pop.base_ref, device="cpu")
    frozen = [p for n, p in pop.model.named_parameters() if "lora_" not in n]
    assert sum(p.numel() for p in frozen) == sum(p.numel() for p in base_model.parameters())
    assert not any(p.requires_grad for p in frozen)


def test_set_genome_validates_and_changes_nothing_on_error(pop: LoRAPopulation) -> None:
    before = pop.get_genome("student_0")
    key = next(k for k in before if ".lora_B." in k)
    bad_shape = {**before, key: torch.zeros(3, 3)}
    missing = {k: v for k, v in before.items() if k != key}
    extra = {**before, "nope.lora_A.weight": torch.zeros(4, 4)}
    nan = {**before, key: torch.full_like(before[key], float("nan"))}
    for genome in (bad_shape, missing, extra, nan):
        with pytest.raises(ValueError):
            pop.set_genome("student_0", genome)
    # finite in float64, infinite in the adapter's float32: loaded as inf (a review)
    past = {**before, key: torch.full(before[key].shape, 1e39, dtype=torch.float64)}
    with pytest.raises(
        ValueError, match=rf"genome {re.escape(key)} holds values beyond the range of the adapter's"
    ):
        pop.set_genome("student_0", past)
    after = pop.get_genome("student_0")
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_set_genome_wants_floating_point_tensors_and_a_refused_add_leaves_no_adapter(
    pop: LoRAPopulation,
) -> None:
    """Integer or bool tensors were copied in silently (an int genome zeroed lora_A); a genome a refused
    ``add`` could not load (a meta tensor, a list) left its half-made adapter behind, name taken."""
    before = pop.get_genome("student_0")
    key = next(iter(before))
    for value in (before[key].long(), before[key].bool(), before[key].to("meta"), before[key].tolist(), None):
        with pytest.raises(ValueError, match=rf"genome {key} must be a floating-point tensor"):
            pop.set_genome("student_0", {**before, key: value})
        with pytest.raises(ValueError, match="floating-point tensor"):
            pop.add("newcomer", {**before, key: value})
        assert "newcomer" not in pop.adapter_names
    assert all(torch.equal(before[k], v) for k, v in pop.get_genome("student_0").items())
    pop.add("newcomer", before)  # the name is free
    pop.remove("newcomer")


def test_from_pretrained_names_what_it_refuses(tiny_base_dir: Path) -> None:
    def build(**kwargs: object) -> LoRAPopulation:
        args = {"names": ["a"], "rank": 2, "dtype": torch.float32, "device": "cpu", **kwargs}
        return LoRAPopulation.from_pretrained(tiny_base_dir, **args)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="not the single string 'abc'"):
        build(names="abc")  # was three adapters a, b, c
    for kwargs, message in (
        ({"rank": 2.5}, "rank must be an int >= 1"),
        ({"rank": True}, "rank must be an int >= 1"),
        ({"alpha": "8"}, "alpha must be a finite number > 0"),
        ({"seed": None}, "seed must be an int"),
        ({"target_modules": ["embed_tokens"]}, "must name linear layers"),
        ({"target_modules": ["q_proj", "nope"]}, r"target_modules \['nope'\] match no linear layer"),
    ):
        with pytest.raises(ValueError, match=message):
            build(**kwargs)
    assert build(target_modules=["q_proj", "v_proj"]).adapter_names == ["a"]
    assert build(target_modules=["layers.0.self_attn.q_proj"]).adapter_names == ["a"]  # PEFT's suffix match


def test_unknown_adapter_is_key_error_listing_names(pop: LoRAPopulation) -> None:
    calls = [
        lambda: pop.get_genome("ghost"),
        lambda: pop.set_active("ghost"),
        lambda: pop.trainable_parameters("ghost"),
        lambda: pop.remove("ghost"),
        lambda: pop.generate(["x"], ["ghost"], 2, 0.0, 0),
    ]
    for call in calls:
        with pytest.raises(KeyError, match="student_1"):
            call()


def test_add_copy_remove(pop: LoRAPopulation) -> None:
    text = prompts(2)
    pop.copy("teacher_0", "clone")
    pop.set_active("clone")
    clone_logits = logits_of(pop, text)
    pop.set_active("teacher_0")
    assert torch.equal(clone_logits, logits_of(pop, text))
    with pytest.raises(ValueError, match="already exists"):
        pop.add("clone")
    for bad in ("bad.name", "ab\n", "x" * 129):  # (a trailing newline, a folder name too long to save)
        with pytest.raises(ValueError, match="must match"):
            pop.add(bad)
    # parts of the module and parameter names: PEFT wrote the other adapters' files under keys that did not
    # load back, and the previous save was gone (a review)
    for bad in ("weight", "layers", "q_proj", "lora_A", "model", "self_attn", "base_layer"):
        with pytest.raises(
            ValueError, match=f"adapter name '{bad}' is a part of the model's module and parameter"
        ):
            pop.add(bad)
    pop.remove("clone")
    assert pop.adapter_names == NAMES
    pop.add("fresh")  # lora_B starts at zero: the fresh adapter is the base
    pop.set_active("fresh")
    fresh_logits = logits_of(pop, text)
    with pop.reference():
        assert torch.equal(fresh_logits, logits_of(pop, text))
    pop.remove("fresh")
    pop.set_active("student_0")


def test_active_adapter_reference_and_trainable_parameters(pop: LoRAPopulation, tiny_base_dir: Path) -> None:
    text = prompts(2)
    per_adapter = []
    for name in NAMES:
        pop.set_active(name)
        per_adapter.append(logits_of(pop, text))
    assert not torch.allclose(per_adapter[0], per_adapter[1])
    pop.set_active(NAMES[0])
    with pop.reference():
        reference = logits_of(pop, text)
        # every generation strategy runs the base alone in there (the stacked one applied the adapters)
        in_reference = {
            strategy: pop.generate(
                text, NAMES[:2], max_new_tokens=8, temperature=0.0, seed=0, strategy=strategy
            )
            for strategy in ("stacked", "peft_mixed", "loop")
        }
    # PEFT's disable_adapter re-enables grads for the active adapter only; every adapter stays trainable
    assert all(p.requires_grad for name in NAMES for p in pop.trainable_parameters(name))
    base_model, tokenizer = load_base(tiny_base_dir, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        assert torch.equal(reference, base_model(**tokenizer(text, return_tensors="pt", padding=True)).logits)
    base_texts = decode(base_model, tokenizer, text, max_new_tokens=8, temperature=0.0, seed=0)
    assert all(texts == base_texts for texts in in_reference.values()), in_reference
    assert pop.generate(text, NAMES[:2], max_new_tokens=8, temperature=0.0, seed=0) != base_texts
    params = pop.trainable_parameters("student_0")
    pop.set_active("teacher_0")  # switching adapters keeps every adapter trainable
    assert params and all(p.requires_grad for p in params)
    pop.set_active("student_0")
    pop.model.zero_grad(set_to_none=True)
    logits_of_grad = pop.model(**pop.tokenizer(text, return_tensors="pt", padding=True)).logits
    logits_of_grad.float().pow(2).mean().backward()
    assert all(p.grad is not None for p in params)
    others = pop.trainable_parameters("teacher_0")
    assert all(p.grad is None for p in others)
    pop.model.zero_grad(set_to_none=True)


# --------------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------------
def test_stacked_forward_matches_peft_per_row(pop: LoRAPopulation) -> None:
    text = prompts(6)
    rows = [NAMES[i % 3] for i in range(6)]
    enc = pop.tokenizer(text, return_tensors="pt", padding=True)
    with torch.no_grad(), stacked_lora(pop.model, rows):
        stacked = pop.model(**enc).logits
    for i, name in enumerate(rows):
        pop.set_active(name)
        with torch.no_grad():
            expected = pop.model(**enc).logits[i]
        torch.testing.assert_close(stacked[i], expected, rtol=1e-5, atol=1e-5)
    assert all("forward" not in vars(layer) for layer in lora_linear_layers(pop.model))  # restored


def test_stacked_lora_restores_forward_on_error(pop: LoRAPopulation) -> None:
    with pytest.raises(RuntimeError, match="inside"), stacked_lora(pop.model, NAMES):
        raise RuntimeError("inside")
    assert all("forward" not in vars(layer) for layer in lora_linear_layers(pop.model))
    with pytest.raises(ValueError, match="rows"), torch.no_grad(), stacked_lora(pop.model, NAMES):
        pop.model(**pop.tokenizer(prompts(2), return_tensors="pt", padding=True))


def test_mixed_batch_greedy_equals_per_adapter_generation(pop: LoRAPopulation) -> None:
    text = prompts(3)
    batch = [p for p in text for _ in NAMES]  # every prompt under every adapter
    rows = NAMES * len(text)
    stacked = pop.generate(batch, rows, max_new_tokens=12, temperature=0.0, seed=0)
    loop = pop.generate(batch, rows, max_new_tokens=12, temperature=0.0, seed=0, strategy="loop")
    mixed = pop.generate(batch, rows, max_new_tokens=12, temperature=0.0, seed=1, strategy="peft_mixed")
    assert stacked == loop == mixed
    by_adapter = [stacked[i :: len(NAMES)] for i in range(len(NAMES))]
    assert len({tuple(texts) for texts in by_adapter}) > 1  # the adapters really generate differently


def test_a_configured_stop_token_that_is_not_special_leaves_no_text(pop: LoRAPopulation) -> None:
    """Generation stops on every id of the base's ``generation_config.eos_token_id``; the texts dropped only
    the tokenizer's EOS, so a stop id that is no special token kept its text in the completion (an audit)."""
    batch, rows = prompts(1), NAMES[:1]
    row = pop.generate_tokens(batch, rows, 4, 0.0, seed=0, ignore_eos=True)[0]
    stop = row[1]
    assert stop not in pop.tokenizer.all_special_ids
    config = pop.model.generation_config
    saved = config.eos_token_id
    config.eos_token_id = [pop.tokenizer.eos_token_id, stop]
    try:
        assert stop in pop.stop_ids
        stopped = pop.generate_tokens(batch, rows, 4, 0.0, seed=0)[0]
        assert stopped == row[: row.index(stop) + 1]
        assert pop.generate(batch, rows, 4, 0.0, seed=0) == [pop.tokenizer.decode(stopped[:-1])]
    finally:
        config.eos_token_id = saved


def test_loop_strategy_samples_each_adapter_from_its_own_stream(pop: LoRAPopulation) -> None:
    """Two adapters with the same weights on the same prompts: one sub-batch each in the ``loop`` strategy,
    seeded alike they drew the same numbers and sampled the same texts (correlated rollouts across the
    population); the one-batch strategies' rows draw differently, and so must the loop's sub-batches."""
    original = pop.get_genome(NAMES[2])
    pop.set_genome(NAMES[2], pop.get_genome(NAMES[1]))
    try:
        text = prompts(4)
        rows = [NAMES[1]] * 4 + [NAMES[2]] * 4
        args = dict(max_new_tokens=10, temperature=1.0, seed=5)
        loop = pop.generate(text + text, rows, strategy="loop", **args)
        assert loop[:4] != loop[4:]
        assert loop == pop.generate(text + text, rows, strategy="loop", **args)  # reproducible
        assert loop[:4] == pop.generate(text, rows[:4], **args)  # the first adapter's: the one-batch stream
        greedy = dict(args, temperature=0.0)
        assert pop.generate(text + text, rows, strategy="loop", **greedy) == pop.generate(
            text + text, rows, **greedy
        )
    finally:
        pop.set_genome(NAMES[2], original)


def test_sampling_is_reproducible_for_a_seed(pop: LoRAPopulation) -> None:
    text, rows = prompts(4), [NAMES[i % 3] for i in range(4)]
    state = torch.random.get_rng_state()
    first = pop.generate(text, rows, 10, temperature=1.0, seed=3)
    assert pop.generate(text, rows, 10, temperature=1.0, seed=3) == first
    assert pop.generate(text, rows, 10, temperature=1.0, seed=4) != first
    nucleus = pop.generate(text, rows, 10, temperature=1.0, seed=3, top_p=0.9)
    assert pop.generate(text, rows, 10, temperature=1.0, seed=3, top_p=0.9) == nucleus
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG was not used


def test_growing_cache_holds_what_the_dynamic_cache_holds(pop: LoRAPopulation) -> None:
    from transformers import DynamicCache

    from agents.generation import cache_kwarg
    from agents.kv_cache import growing_cache

    enc = pop.tokenizer(prompts(2), return_tensors="pt", padding=True)
    index = torch.tensor([1, 0, 1])
    runs = []
    for cache in (DynamicCache(), growing_cache()):
        key, mask = cache_kwarg(pop.model), enc["attention_mask"]
        with torch.no_grad():
            logits = [pop.model(**enc, use_cache=True, **{key: cache}).logits[:, -1]]
            # The first step outgrows the prefill's exact-size buffer; then rows are repeated and reordered.
            for step in (
                torch.tensor([[5], [6]]),
                None,
                torch.tensor([[7], [8], [9]]),
                torch.tensor([[4]] * 3),
            ):
                if step is None:
                    cache.batch_select_indices(index)
                    mask = mask[index]
                    continue
                mask = torch.cat([mask, torch.ones_like(step)], dim=1)
                logits.append(pop.model(input_ids=step, attention_mask=mask, **{key: cache}).logits[:, -1])
        runs.append((logits, [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]))
    (expected, expected_kv), (got, got_kv) = runs
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(expected_kv, got_kv, strict=True)
    )


def test_share_rows_groups_by_prompt_and_key() -> None:
    first, inverse = share_rows(["a", "a", "b", "a", "b"], ["x", "x", "x", "y", "x"])
    assert (first, inverse) == ([0, 2, 3], [0, 0, 1, 2, 1])
    assert share_rows(["a", "b", "a"], None) == ([0, 1], [0, 1, 0])


@pytest.mark.parametrize("strategy", ["stacked", "peft_mixed", "loop"])
def test_shared_prefill_equals_every_row_prefilled(pop: LoRAPopulation, strategy: str) -> None:
    # GRPO-like groups (one prompt, one adapter, several rows) mixed with a prompt under two adapters
    # and prompts of different lengths (left padding), in an interleaved row order.
    a, b = prompts(2)
    batch = [a, a, b, a, b, a, b]
    rows = ["student_0", "student_0", "teacher_0", "teacher_0", "teacher_0", "student_0", "student_1"]
    assert len(share_rows(batch, rows)[0]) == 4  # 7 rows, 4 prefills
    for temperature in (0.0, 1.0):
        args = dict(max_new_tokens=10, temperature=temperature, seed=5, strategy=strategy)
        shared = pop.generate_tokens(batch, rows, **args)
        assert pop.generate_tokens(batch, rows, share_prefill=False, **args) == shared
        assert pop.generate(batch, rows, **args) == pop.generate(batch, rows, share_prefill=False, **args)
    sampled = pop.generate(batch, rows, 10, temperature=1.0, seed=5, strategy=strategy)
    assert sampled[0] != sampled[1]  # rows sharing a prefill still draw their own tokens


def test_generated_tokens_end_on_eos_or_the_budget(pop: LoRAPopulation) -> None:
    text, rows = prompts(6), [NAMES[i % 3] for i in range(6)]
    eos = pop.tokenizer.eos_token_id

    def likely_eos(module: object, inputs: object, logits: torch.Tensor) -> torch.Tensor:
        return logits + 4.0 * torch.nn.functional.one_hot(torch.tensor(eos), logits.shape[-1])

    hook = pop.model.get_output_embeddings().register_forward_hook(likely_eos)
    try:
        ids = pop.generate_tokens(text, rows, 24, temperature=1.0, seed=2)
        texts = pop.generate(text, rows, 24, temperature=1.0, seed=2)
    finally:
        hook.remove()
    assert any(row[-1] == eos for row in ids) and any(len(row) > 1 for row in ids)
    for row in ids:
        assert 1 <= len(row) <= 24 and eos not in row[:-1]
        assert row[-1] == eos or len(row) == 24
    stripped = [row[:-1] if row[-1] == eos else row for row in ids]
    assert texts == [pop.tokenizer.decode(row, skip_special_tokens=True) for row in stripped]


def test_generation_stops_on_every_stop_id_of_the_generation_config(pop: LoRAPopulation) -> None:
    """Chat bases list more stop ids in ``generation_config.eos_token_id`` than the tokenizer's EOS (an
    end-of-turn token): generation ran past them to the budget, where ``transformers`` stops."""
    text, rows = prompts(3), [NAMES[0]] * 3
    free = pop.generate_tokens(text, rows, 8, 0.0, 0)
    other = free[0][1]  # a token the greedy decode produces (second step of the first row)
    config = pop.model.generation_config
    saved = config.eos_token_id
    config.eos_token_id = [pop.tokenizer.eos_token_id, other]
    try:
        stopped = pop.generate_tokens(text, rows, 8, 0.0, 0)
        enc = pop.tokenizer(text[:1], return_tensors="pt", split_special_tokens=True)
        pop.model.eval()
        theirs = pop.model.generate(**enc, max_new_tokens=8, do_sample=False, adapter_names=[NAMES[0]],
                                    pad_token_id=pop.tokenizer.pad_token_id)  # fmt: skip
    finally:
        config.eos_token_id = saved
    assert stopped[0] == free[0][:2] == theirs[0, enc["input_ids"].shape[1] :].tolist()
    for mine, full in zip(stopped, free, strict=True):  # each row cut after its first stop id
        cut = next((i + 1 for i, t in enumerate(full) if t == other), len(full))
        assert mine == full[:cut]


def test_generation_pads_on_the_left_whatever_the_tokenizer_says(pop: LoRAPopulation) -> None:
    """Positions and last-position logits assume left padding: a tokenizer set to pad on the right made
    every shorter row continue from its padding."""
    text, rows = ["def f(x):\n    return x", "x"], [NAMES[0], NAMES[1]]
    left = pop.generate(text, rows, 8, 0.0, 0)
    pop.tokenizer.padding_side = "right"
    try:
        assert pop.generate(text, rows, 8, 0.0, 0) == left
    finally:
        pop.tokenizer.padding_side = "left"


def test_tiny_temperatures_and_numpy_numbers_generate(pop: LoRAPopulation) -> None:
    """``logits / T`` overflowed to inf for a tiny ``T`` (a NaN softmax: torch refused to sample); numpy
    numbers, accepted by ``RolloutConfig`` and ``LoRAPolicy``, were refused at the first generation."""
    text, rows = prompts(2), [NAMES[0], NAMES[2]]
    greedy = pop.generate(text, rows, 6, 0.0, 0)
    assert pop.generate(text, rows, 6, 1e-40, 0) == greedy
    assert pop.generate(text, rows, 6, np.float32(0.7), np.int64(3), np.float64(0.9)) == pop.generate(
        text, rows, 6, 0.7, 3, 0.9
    )


def test_top_p_keeps_the_smallest_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(filter_top_p(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_top_p(logits, 0.5)).tolist() == [[True, False, False, False]]
    assert torch.equal(filter_top_p(logits, 1.0), logits)
    # a top_p float32 rounds to 0 kept nothing, and a temperature it rounds to 0 gave NaN (a robustness review):
    # the most likely token is kept, and such a temperature decodes greedily
    assert torch.isfinite(filter_top_p(logits, 1e-300)).tolist() == [[True, False, False, False]]
    from agents.generation import choose_tokens

    for temperature, top_p in ((5e-324, 1.0), (1.0, 1e-300), (1e-45, 1e-300)):
        assert choose_tokens(logits, temperature, top_p, torch.Generator().manual_seed(0)).tolist() == [0]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"adapters": ["student_0"]}, ValueError),
        ({"max_new_tokens": -1}, ValueError),
        ({"temperature": -0.5}, ValueError),
        ({"top_p": 0.0}, ValueError),
        ({"strategy": "magic"}, ValueError),
        ({"prompts": "one string"}, TypeError),
        ({"prompts": ["a", None]}, TypeError),
        ({"prompts": ["a", "caf\udce9"]}, ValueError),
        ({"max_new_tokens": 2.5}, ValueError),
        ({"max_new_tokens": True}, ValueError),
        ({"temperature": "0.5"}, ValueError),
        ({"top_p": None}, ValueError),
        ({"seed": 1.5}, ValueError),
        ({"seed": 2**70}, ValueError),
    ],
)
def test_generate_rejects_bad_arguments(pop: LoRAPopulation, kwargs: dict, error: type) -> None:
    args = {"prompts": ["a", "b"], "adapters": ["student_0", "teacher_0"], "max_new_tokens": 2,
            "temperature": 0.0, "seed": 0, **kwargs}  # fmt: skip
    with pytest.raises(error):
        pop.generate(**args)


def test_a_prompt_with_a_lone_surrogate_is_named_with_its_character(pop: LoRAPopulation) -> None:
    with pytest.raises(
        ValueError, match=r"prompt 1 is not valid Unicode: a lone surrogate '\\udce9' at character 3"
    ):
        pop.generate(["a", "caf\udce9"], ["student_0", "teacher_0"], 2, 0.0, 0)


def test_generate_edge_cases(pop: LoRAPopulation) -> None:
    assert pop.generate([], [], 5, 0.0, 0) == []
    assert pop.generate(["a", "b"], ["student_0", "teacher_0"], 0, 0.0, 0) == ["", ""]


# --------------------------------------------------------------------------------------------------------
# Persistence
# --------------------------------------------------------------------------------------------------------
def test_save_load_round_trip_gives_identical_logits(pop: LoRAPopulation, tmp_path: Path) -> None:
    from peft import PeftModel

    manifest = pop.save(tmp_path / "run")
    assert json.loads(manifest.read_text())["adapters"] == NAMES
    loaded = LoRAPopulation.load(tmp_path / "run", dtype=torch.float32, device="cpu")
    assert loaded.adapter_names == NAMES
    text = prompts(3)
    for name in NAMES:
        pop.set_active(name)
        loaded.set_active(name)
        assert torch.equal(logits_of(pop, text), logits_of(loaded, text))
    plain_base, _ = load_base(pop.base_ref, dtype=torch.float32, device="cpu")
    folder = tmp_path / "run" / json.loads(manifest.read_text())["adapters_dir"]
    alone = PeftModel.from_pretrained(plain_base, os.fspath(folder / "student_1"))
    pop.set_active("student_1")
    with torch.no_grad():
        enc = pop.tokenizer(text, return_tensors="pt", padding=True)
        assert torch.equal(alone(**enc).logits, pop.model(**enc).logits)
    with pytest.raises(FileNotFoundError):
        LoRAPopulation.load(tmp_path / "empty")


def test_save_refuses_a_file_for_its_folder_or_a_folder_for_its_manifest(
    pop: LoRAPopulation, tmp_path: Path
) -> None:
    """A file as the folder was a bare FileExistsError; a folder as the manifest left an adapters folder
    behind (a review): both are refused before anything is written."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"file is a file, not the folder to save in"):
        pop.save(tmp_path / "file")
    (tmp_path / "run" / "population.json").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"population.json is a folder, not the manifest a save writes"):
        pop.save(tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["population.json"]


def test_save_fsyncs_the_adapter_files_before_the_manifest_names_them(
    pop: LoRAPopulation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the manifest was fsynced: after a power loss it could name adapter files never written to
    disk, with the previous save already removed."""
    synced: list[str] = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    pop.save(tmp_path / "run")
    manifest = next(i for i, path in enumerate(synced) if Path(path).name.startswith(".population.json"))
    weights = [i for i, path in enumerate(synced) if path.endswith("adapter_model.safetensors")]
    assert len(weights) == len(pop.adapter_names) and max(weights) < manifest


def test_an_interrupted_save_leaves_the_previous_one_whole(
    pop: LoRAPopulation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second save into the same folder, stopped while writing its second adapter, must leave the first
    save loadable as it was (it wrote over the first save's adapters in place: a mix of two saves loaded
    without a word); a finished save removes the earlier save's folders."""
    run = tmp_path / "run"
    mine = run / "adapters" / "my_finetune" / "adapter_model.safetensors"  # not a save's: it stays
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"user data")
    pop.save(run)
    before = {name: pop.get_genome(name) for name in NAMES}
    first_folder = json.loads((run / "population.json").read_text())["adapters_dir"]
    save_pretrained, calls = type(pop.model).save_pretrained, []

    def killed_on_the_second(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed mid-save")
        return save_pretrained(self, *args, **kwargs)

    name = NAMES[0]
    pop.set_genome(name, {k: v + 1.0 for k, v in before[name].items()})
    try:
        with monkeypatch.context() as patch:
            patch.setattr(type(pop.model), "save_pretrained", killed_on_the_second)
            with pytest.raises(KeyboardInterrupt):
                pop.save(run)
        loaded = LoRAPopulation.load(run, dtype=torch.float32, device="cpu")
        for other in NAMES:
            assert all(torch.equal(v, before[other][k]) for k, v in loaded.get_genome(other).items()), other
        assert sorted(p.name for p in run.iterdir()) == sorted([first_folder, "adapters", "population.json"])

        # killed after its folder's rename, before the manifest: the first save still loads, and the orphan
        # folder goes with the next whole save
        def no_manifest(*args: Any, **kwargs: Any) -> None:
            raise KeyboardInterrupt("killed before the manifest")

        with monkeypatch.context() as patch:
            patch.setattr(population_module, "atomic_write_bytes", no_manifest)
            with pytest.raises(KeyboardInterrupt):
                pop.save(run)
        assert len([p for p in run.iterdir() if p.name.startswith("adapters-")]) == 2
        assert all(
            torch.equal(v, before[NAMES[1]][k])
            for k, v in LoRAPopulation.load(run, dtype=torch.float32, device="cpu")
            .get_genome(NAMES[1])
            .items()
        )
        pop.save(run)  # a whole save replaces the first, and its folder (and the orphan) goes
        assert json.loads((run / "population.json").read_text())["adapters_dir"] != first_folder
        assert len([p for p in run.iterdir() if p.name.startswith("adapters-")]) == 1
        assert not (run / first_folder).exists() and mine.read_bytes() == b"user data"
        changed = LoRAPopulation.load(run, dtype=torch.float32, device="cpu").get_genome(name)
        assert all(torch.equal(v, before[name][k] + 1.0) for k, v in changed.items())
    finally:
        pop.set_genome(name, before[name])


def test_load_names_what_is_wrong_with_a_saved_population(pop: LoRAPopulation, tmp_path: Path) -> None:
    run = tmp_path / "run"
    pop.save(run)
    manifest = json.loads((run / "population.json").read_text())
    folder = run / manifest["adapters_dir"]

    def load_with(**changes: Any) -> None:
        (run / "population.json").write_text(json.dumps({**manifest, **changes}))
        LoRAPopulation.load(run, dtype=torch.float32, device="cpu")

    for changes, message in (
        ({"adapters": []}, "'adapters' must be a non-empty list"),
        ({"active": "nobody"}, "'active' 'nobody' is not among the adapters"),
        ({"format": "other"}, "is not a population manifest"),
        ({"version": 9}, "version 9 is not one this package reads"),
        ({"adapters_dir": "../elsewhere"}, "'adapters_dir' must name an adapters folder"),
    ):
        with pytest.raises(ValueError, match=message):
            load_with(**changes)
    with pytest.raises(FileNotFoundError, match=r"adapter 'ghost' listed in .* has no .*ghost"):
        load_with(adapters=[*NAMES, "ghost"])
    # a file edited and saved again: PEFT loaded it without a word, the missing tensors at their fresh
    # initialisation, a NaN as it is (a robustness review)
    from safetensors.torch import load_file, save_file

    weights = folder / NAMES[1] / "adapter_model.safetensors"
    whole = load_file(weights)
    dropped = next(k for k in whole if ".lora_B." in k)
    save_file({k: v for k, v in whole.items() if k != dropped}, weights)
    with pytest.raises(
        ValueError,
        match=rf"adapter '{NAMES[1]}' in .* does not hold its tensors: missing \['{re.escape(dropped)}'\]",
    ):
        load_with()
    save_file({**whole, dropped: torch.full_like(whole[dropped], float("nan"))}, weights)
    with pytest.raises(
        ValueError, match=rf"adapter '{NAMES[1]}' in .* holds non-finite values at {re.escape(dropped)}"
    ):
        load_with()
    save_file(whole, weights)
    load_with()  # as saved: loads
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=rf"adapter '{NAMES[1]}' in .* does not load: SafetensorError"):
        load_with()
    (run / "population.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        LoRAPopulation.load(run)
    # the layout of version 1 (every save in "adapters", no adapters_dir) still loads
    pop.save(run)
    manifest = json.loads((run / "population.json").read_text())
    (run / manifest.pop("adapters_dir")).rename(run / "adapters")
    (run / "population.json").write_text(json.dumps({**manifest, "version": 1}))
    assert LoRAPopulation.load(run, dtype=torch.float32, device="cpu").adapter_names == NAMES


def test_generating_past_the_trained_positions_is_logged_once(
    pop: LoRAPopulation, caplog: pytest.LogCaptureFixture
) -> None:
    """RoPE models run past max_position_embeddings (nothing is cut), so it is a warning, once per model."""
    import logging

    from agents import generation

    generation._warned_context.discard(pop.model)
    limit = pop.model.config.max_position_embeddings
    with caplog.at_level(logging.WARNING, logger="agents.generation"):
        pop.generate(["a b c"], ["student_0"], 2, 0.0, 0)
        assert "max_position_embeddings" not in caplog.text
        long_prompt = " ".join(["x"] * limit)
        assert pop.generate([long_prompt] * 2, ["student_0", "teacher_0"], 2, 0.0, 0)
        pop.generate([long_prompt], ["student_0"], 2, 0.0, 0)
    assert caplog.text.count(f"runs past the model's max_position_embeddings ({limit})") == 1
