"""Weight-space operators: structure, purity, determinism, the space each works in, PEFT round trips."""

from __future__ import annotations

import copy
import itertools
import re
import threading

import pytest
import torch
from torch import nn

from evolve import crossovers, genome, lowrank, operators
from evolve.genome import check_parents, lora_pairs, pair_batches
from tests.agents_fixtures import torch_threads

# (in_features, out_features) per module: square, wide-out, narrow-out (k/v-like), and rank r = 4.
SHAPES = {"q_proj": (24, 24), "up_proj": (24, 40), "k_proj": (24, 8), "down_proj": (40, 24)}
RANK = 4
PAIRED = sorted(operators.CROSSOVERS)
# Crossovers whose definition makes a parent crossed with itself that parent (in the space named).
SELF_IDENTITY = ["dare", "uniform", "svd_splice", "extrapolate", "es", "interpolate"]
DENSE_MUTATIONS = sorted(set(operators.MUTATIONS) - operators.LORA_ONLY)
DENSE_CROSSOVERS = sorted(set(operators.CROSSOVERS) - operators.LORA_ONLY)


def lora_genome(seed: int, dtype: torch.dtype = torch.float32, layers: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    genome = {}
    for layer in range(layers):
        for name, (fin, fout) in SHAPES.items():
            prefix = f"base_model.model.layers.{layer}.{name}"
            genome[f"{prefix}.lora_A.weight"] = (torch.randn(RANK, fin, generator=g) / fin**0.5).to(dtype)
            genome[f"{prefix}.lora_B.weight"] = (torch.randn(fout, RANK, generator=g) * 0.1).to(dtype)
    return genome


def chunked_parents() -> list[dict[str, torch.Tensor]]:
    """Two parents with CHUNK_PAIRS + 4 layers: each shape's batch splits into two parallel units."""
    return [lora_genome(seed, layers=genome.CHUNK_PAIRS + 4) for seed in (1, 2)]


def delta_w(genome: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {p.module: genome[p.b_key].double() @ genome[p.a_key].double() for p in lora_pairs(genome)}


def assert_same_delta(child, parent, atol=1e-5) -> None:
    ours, theirs = delta_w(child), delta_w(parent)
    for module in theirs:
        torch.testing.assert_close(ours[module], theirs[module], atol=atol, rtol=1e-4)


def assert_same_structure(child, parent) -> None:
    assert list(child) == list(parent)
    storages = [t.untyped_storage().data_ptr() for t in child.values()]
    assert len(set(storages)) == len(storages), "child tensors share storage (safetensors would refuse them)"
    for key, tensor in parent.items():
        assert child[key].shape == tensor.shape, key
        assert child[key].dtype == tensor.dtype, key
        assert child[key].data_ptr() != tensor.data_ptr(), f"{key} aliases its parent"
        if child[key].is_floating_point():
            assert torch.isfinite(child[key]).all(), key


def mutate(name, genome, seed=0, **kwargs):
    return operators.MUTATIONS[name](genome, rng=torch.Generator().manual_seed(seed), **kwargs)


def cross(name, parents, seed=0, fitness=(1.0, 0.0), **kwargs):
    return operators.CROSSOVERS[name](
        parents, rng=torch.Generator().manual_seed(seed), fitness=fitness, **kwargs
    )


def plain_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)  # test-local model construction only
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 3))


# --- every operator: structure, purity, determinism ----------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", sorted(operators.MUTATIONS))
def test_mutation_preserves_structure_and_inputs(name, dtype):
    parent = lora_genome(1, dtype)
    before = copy.deepcopy(parent)
    child = mutate(name, parent, strength=0.2)
    assert_same_structure(child, parent)
    assert all(torch.equal(parent[k], before[k]) for k in before)
    assert not all(torch.equal(child[k], parent[k]) for k in parent), "mutation changed nothing"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", PAIRED)
def test_crossover_preserves_structure_and_inputs(name, dtype):
    parents = [lora_genome(1, dtype), lora_genome(2, dtype)]
    before = copy.deepcopy(parents)
    child = cross(name, parents)
    assert_same_structure(child, parents[0])
    for parent, saved in zip(parents, before, strict=True):
        assert all(torch.equal(parent[k], saved[k]) for k in saved)


@pytest.mark.parametrize("name", sorted(operators.MUTATIONS))
def test_mutation_deterministic_for_a_seed(name):
    parent = lora_genome(1)
    first, again, other = mutate(name, parent, 5), mutate(name, parent, 5), mutate(name, parent, 6)
    assert all(torch.equal(first[k], again[k]) for k in parent)
    assert not all(torch.equal(first[k], other[k]) for k in parent)


@pytest.mark.parametrize("name", PAIRED)
def test_crossover_deterministic_for_a_seed(name):
    parents = [lora_genome(1), lora_genome(2)]
    first, again = cross(name, parents, seed=5), cross(name, parents, seed=5)
    assert all(torch.equal(first[k], again[k]) for k in first)
    if name != "es":  # es is deterministic given fitness by definition
        others = [cross(name, parents, seed=s) for s in range(6, 9)]
        assert any(not torch.equal(first[k], o[k]) for o in others for k in first)


@pytest.mark.parametrize("name", SELF_IDENTITY)
def test_crossover_with_itself_returns_the_parent(name):
    parent = lora_genome(3)
    child = cross(name, [parent, copy.deepcopy(parent)])
    assert_same_delta(child, parent)
    if name in ("dare", "uniform"):  # factor / module space: the factors themselves come back
        assert all(torch.equal(child[k], parent[k]) for k in parent)


@pytest.mark.parametrize("fitness", [(1.0, 0.0), (0.0, 1.0)])  # the first parent, better or not
@pytest.mark.parametrize("name", sorted(operators.MUTATIONS) + PAIRED)
def test_non_lora_tensors_of_a_lora_genome_pass_through_from_the_first_parent(name, fitness):
    parents = [lora_genome(1), lora_genome(2)]
    for seed, parent in enumerate(parents):
        parent["base_model.model.head.weight"] = torch.full((3, 5), float(seed))
        parent["base_model.model.steps"] = torch.tensor(seed)
    child = mutate(name, parents[0]) if name in operators.MUTATIONS else cross(name, parents, fitness=fitness)
    # clone_mutate clones the better parent whole, by definition
    source = parents[1] if name == "clone_mutate" and fitness[1] > fitness[0] else parents[0]
    assert_same_structure(child, source)
    for key in ("base_model.model.head.weight", "base_model.model.steps"):
        assert torch.equal(child[key], source[key]), key


@pytest.mark.parametrize("name", sorted(operators.CROSSOVERS))
def test_two_parents_lists_exactly_the_crossovers_that_refuse_three(name):
    parents = [lora_genome(seed) for seed in range(3)]
    fitness = [1.0, 0.5, 0.0]
    if name in operators.TWO_PARENTS:
        with pytest.raises(ValueError, match="needs exactly 2 parents, got 3"):
            operators.CROSSOVERS[name](parents, rng=torch.Generator().manual_seed(0), fitness=fitness)
    else:
        assert_same_structure(
            operators.CROSSOVERS[name](parents, rng=torch.Generator().manual_seed(0), fitness=fitness),
            parents[0],
        )


def test_unknown_name_lists_the_registry():
    with pytest.raises(KeyError, match="registered: component_mask, gaussian"):
        operators.MUTATIONS["nope"]
    with pytest.raises(KeyError) as info:
        operators.CROSSOVERS["nope"]
    assert all(name in str(info.value) for name in operators.CROSSOVERS)


@pytest.mark.parametrize("name", PAIRED)
def test_mismatched_parents_name_the_key(name):
    parent = lora_genome(1)
    key = "base_model.model.layers.1.up_proj.lora_A.weight"
    other_rank = {k: t for k, t in lora_genome(2).items()}
    other_rank[key] = torch.randn(RANK + 2, 24)
    other_rank[key.replace("lora_A", "lora_B")] = torch.randn(40, RANK + 2)
    with pytest.raises(ValueError, match=r"layers\.1\.up_proj\.lora_A\.weight.*rank"):
        cross(name, [parent, other_rank])
    missing = {k: t for k, t in lora_genome(2).items() if "layers.0.k_proj" not in k}
    with pytest.raises(ValueError, match=r"layers\.0\.k_proj"):
        cross(name, [parent, missing])
    wrong_dtype = {k: t.double() if "down_proj" in k else t for k, t in lora_genome(2).items()}
    with pytest.raises(ValueError, match=r"down_proj.*dtype"):
        cross(name, [parent, wrong_dtype])


@pytest.mark.parametrize("extra", ["lora_B.bias", "lora_B.default.bias", "lora_magnitude_vector"])
def test_trained_adapter_parts_the_operators_do_not_combine_are_refused_by_name(extra):
    """PEFT's ``lora_bias=True`` bias and DoRA's magnitudes were passed through from the first parent: an
    interpolation all the way to the second parent kept the first's bias (an audit)."""
    key = f"base_model.model.layers.1.up_proj.{extra}"
    parents = [{**lora_genome(seed), key: torch.full((40,), float(seed))} for seed in (1, 2)]
    for name in operators.CROSSOVERS:
        with pytest.raises(ValueError, match=re.escape(repr(key)) + ".*lora_bias=False, use_dora=False"):
            cross(name, parents)
    for name in operators.MUTATIONS:
        with pytest.raises(ValueError, match=re.escape(repr(key))):
            operators.MUTATIONS[name](parents[0], rng=torch.Generator().manual_seed(0), strength=0.1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_parents_are_refused_naming_the_parent_and_key(bad):
    """ΔW-space operators failed inside LAPACK (naming a batch element), the others passed the NaN on."""
    key = "base_model.model.layers.1.up_proj.lora_A.weight"
    poisoned = lora_genome(2)
    poisoned[key] = poisoned[key].clone()
    poisoned[key][3, 5] = bad
    plain = plain_net(0).state_dict()
    plain["0.weight"] = plain["0.weight"].clone()
    plain["0.weight"][0, 0] = bad
    for name in operators.MUTATIONS:
        with pytest.raises(ValueError, match=rf"genome has non-finite values .* at key '{re.escape(key)}'"):
            mutate(name, poisoned)
    for name in operators.CROSSOVERS:
        with pytest.raises(ValueError, match=rf"parent 1 has non-finite values .* at key '{re.escape(key)}'"):
            cross(name, [lora_genome(1), poisoned])
    for name in sorted(set(operators.MUTATIONS) - operators.LORA_ONLY):
        with pytest.raises(ValueError, match=r"genome has non-finite values .* at key '0\.weight'"):
            mutate(name, plain)
    with pytest.raises(ValueError, match="base has non-finite values"):
        cross("dare", [lora_genome(1), lora_genome(3)], base=poisoned)
    huge = {k: t * 1e37 if "lora_A" in k else t for k, t in lora_genome(1).items()}  # sums overflow, finite
    assert_same_structure(mutate("gaussian", huge), huge)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_dw_crossovers_name_non_finite_factors_their_decomposition_finds(bad):
    """extrapolate, es and interpolate leave the parents' finiteness to their own decomposition
    (``detached(checks_its_parents=True)``): every factor, parent and decomposition path is still named,
    and so are parents the combination skips (a zero coefficient) and entries outside the LoRA pairs."""
    for which, factor, layer in itertools.product((0, 1), ("lora_A", "lora_B"), (0, 1)):
        key = f"base_model.model.layers.{layer}.up_proj.{factor}.weight"
        parents = [lora_genome(1), lora_genome(3)]
        related = [parents[0], {k: t + 1e-6 * torch.ones_like(t) for k, t in parents[0].items()}]
        for pair in (parents, related):  # Gram path, Householder path
            pair = list(pair)
            pair[which] = dict(pair[which])
            pair[which][key] = pair[which][key].clone()
            pair[which][key][2, 1] = bad
            for name, kwargs in [
                ("extrapolate", {"fitness": (0.0, 1.0)}),
                ("es", {}),
                ("interpolate", {"weight": 0.3}),
                ("interpolate", {"weight": float(which == 0)}),  # the poisoned parent's coefficient is 0
            ]:
                with pytest.raises(
                    ValueError, match=rf"parent {which} has non-finite values .* '{re.escape(key)}'"
                ):
                    cross(name, pair, **kwargs)
    with_buffer = [{**lora_genome(seed), "head.weight": torch.ones(2, 3)} for seed in (1, 3)]
    with_buffer[1]["head.weight"] = torch.full((2, 3), bad)
    plain = [plain_net(0).state_dict(), plain_net(1).state_dict()]
    plain[1]["0.weight"] = plain[1]["0.weight"].clone()
    plain[1]["0.weight"][0, 0] = bad
    for name in ("extrapolate", "es", "interpolate"):
        for pair, key in ((with_buffer, "head.weight"), (plain, "0.weight")):
            with pytest.raises(ValueError, match=rf"parent 1 has non-finite values .* '{re.escape(key)}'"):
                cross(name, pair)


def test_svd_spectrum_refuses_a_strength_that_overflows():
    with pytest.raises(ValueError, match="strength 100 scales a singular value past the float range"):
        mutate("svd_spectrum", lora_genome(1), strength=100.0)


def test_children_that_overflow_their_dtype_are_refused_naming_the_key():
    """Finite parents of extreme magnitude: some operators returned infinite children without a word (the
    PBT loop then played and checkpointed them), the ΔW-space ones failed in LAPACK naming nothing, and
    svd_spectrum blamed a strength of 0."""
    g = torch.Generator().manual_seed(0)

    def lora(scale: float) -> dict[str, torch.Tensor]:
        return {"m.x.lora_A.weight": torch.randn(3, 5, generator=g) * scale,
                "m.x.lora_B.weight": torch.randn(6, 3, generator=g) * scale}  # fmt: skip

    big = lora(1e19)
    for name in ("svd_spectrum", "component_mask"):
        with pytest.raises(
            ValueError, match=rf"{name}: B @ A of the genome overflows torch.float32 at key 'm\.x\.lora_A"
        ):
            mutate(name, big, strength=0.0)
    with pytest.raises(ValueError, match=r"interpolate.* overflows .* at key 'm\.x\.lora_"):
        cross("interpolate", [big, lora(1e19)])
    # fp16 parents whose products fit; extrapolating far past them (ΔW_2 = -ΔW_1) gives factors past
    # fp16's range: found by the batch's range check, named by check_finite on that batch
    first = {k: t.half() * 100 for k, t in lora(1.0).items()}
    second = {k: -t if "lora_B" in k else t for k, t in first.items()}
    with pytest.raises(ValueError, match=r"extrapolate's child .* at key 'm\.x\.lora_(A|B)\.weight'"):
        cross("extrapolate", [first, second], max_step=1e6)
    with pytest.raises(ValueError, match=r"gaussian's child .* at key 'm\.x\.lora_(A|B)\.weight'"):
        mutate("gaussian", lora(1.0), strength=1e39)
    half = {k: t.half() for k, t in lora(1.0).items()}
    with pytest.raises(ValueError, match=r"dare's child .* at key"):  # the rescale passes fp16's 65504
        cross("dare", [{k: t * 3e4 for k, t in half.items()}, half], drop=0.9)
    with pytest.raises(
        ValueError,
        match=r"neftune_a: strength 1e\+39 gives noise past the range of torch.float32 at key 'm\.x\.lora_A",
    ):
        mutate("neftune_a", lora(1.0), strength=1e39)
    with pytest.raises(
        ValueError, match=r"neftune_a's child .* at key 'm\.x\.lora_A\.weight'"
    ):  # checked by itself
        mutate("neftune_a", {k: (t.clamp(-1, 1) * 6e4).half() for k, t in lora(1.0).items()}, strength=1.0)


def test_wrong_argument_types_say_what_was_expected():
    parent = lora_genome(1)
    with pytest.raises(TypeError, match=r"uniform: parents must be a sequence of genomes .* got a dict"):
        cross("uniform", parent)
    with pytest.raises(TypeError, match=r"interpolate: parents must be a sequence of genomes .* got a dict"):
        cross("interpolate", parent)
    with pytest.raises(TypeError, match=r"parent 1 must be a genome .* got a str"):
        cross("uniform", [parent, "parent"])
    with pytest.raises(TypeError, match="gaussian: genome must be a dict of tensors, got a list"):
        mutate("gaussian", [parent])
    with pytest.raises(ValueError, match=r"fitness: need a 1-D tensor .* shape \(1, 2\)"):
        cross("es", [parent, lora_genome(2)], fitness=torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match=r"fitness: need one number per parent \(2\)"):
        cross("es", [parent, lora_genome(2)], fitness=[[1.0], [2.0]])
    other = {k: t.double() if "down_proj" in k else t for k, t in lora_genome(2).items()}
    with pytest.raises(
        ValueError, match=r"down_proj.*dtype torch.float32 in parent 0, torch.float64 in base"
    ):
        cross("dare", [parent, lora_genome(3)], base=other)
    # (a review: "12" was read as [1.0, 2.0], a set in no order, a dict called a genome holding floats, an
    # int too large for a float an OverflowError; rng=None an AttributeError, base=[...] one naming nothing)
    for fitness in ("12", {5.0, 1.0}, {0: 1.0, 1: 2.0}):
        with pytest.raises(
            ValueError, match=rf"fitness: need a sequence of numbers .* got a {type(fitness).__name__}"
        ):
            cross("es", [parent, lora_genome(2)], fitness=fitness)
    with pytest.raises(ValueError, match=r"fitness: need one number per parent \(2\)"):
        cross("es", [parent, lora_genome(2)], fitness=[10**400, 1])
    import numpy as np  # (an array, ordered, is taken as a list is)

    assert_same_structure(cross("es", [parent, lora_genome(2)], fitness=np.array([2.0, 1.0])), parent)
    for strength, error, message in ((None, TypeError, "must be a number, got NoneType"),
                                     ("0.1", TypeError, "must be a number, got str"),
                                     (10**400, ValueError, "must be a finite number >= 0"),
                                     (torch.tensor([0.1]), TypeError, "must be a number, got Tensor"),
                                     (torch.tensor(True), TypeError, "must be a number, got Tensor"),
                                     (torch.tensor(-0.1), ValueError, "must be a finite number >= 0")):  # fmt: skip
        with pytest.raises(error, match=f"strength: {message}"):
            mutate("gaussian", parent, strength=strength)
    # a 0-d real tensor or array is its number (a schedule's strength was refused as "not a number")
    for scalar in (torch.tensor(0.1), np.array(0.1), torch.tensor(0.1, dtype=torch.float64)):
        assert_same_structure(mutate("gaussian", parent, strength=scalar), parent)
        child, expected = (
            mutate("gaussian", parent, strength=scalar),
            mutate("gaussian", parent, strength=float(scalar)),
        )
        assert all(torch.equal(child[key], expected[key]) for key in parent)
    for rng in (None, 0):
        with pytest.raises(TypeError, match=f"rng must be a torch.Generator, got a {type(rng).__name__}"):
            operators.MUTATIONS["gaussian"](parent, rng=rng)
        with pytest.raises(TypeError, match=f"es: rng must be a torch.Generator, got a {type(rng).__name__}"):
            operators.CROSSOVERS["es"]([parent, parent], rng=rng, fitness=[1.0, 0.0])
    with pytest.raises(TypeError, match=r"dare: base must be a genome .*, got a list"):
        cross("dare", [parent, lora_genome(3)], base=[parent])


def test_an_adapter_with_a_zero_a_keeps_a_trainable_child():
    """``A = 0`` with ``B != 0`` still trains (``∂L/∂A = Bᵀ ∂L/∂W``), but ΔW-space operators gave its
    children zero ``A`` and zero ``B``: no gradient reaches either, the adapter was dead for good."""
    g = torch.Generator().manual_seed(0)
    parent = {"m.x.lora_A.weight": torch.zeros(3, 5), "m.x.lora_B.weight": torch.randn(6, 3, generator=g)}
    children = {"svd_spectrum": mutate("svd_spectrum", parent), "component_mask": mutate("component_mask", parent),
                "interpolate": cross("interpolate", [parent, parent]),
                "svd_splice": cross("svd_splice", [parent, parent])}  # fmt: skip
    for name, child in children.items():
        assert float(delta_w(child)["m.x"].abs().max()) == 0.0, name  # ΔW stays 0
        norms = torch.linalg.vector_norm(child["m.x.lora_A.weight"], dim=1)
        torch.testing.assert_close(norms, torch.full((3,), lowrank.FRESH_ROW_NORM), msg=name)


def test_a_rank_above_the_module_size_keeps_svd_spectrum_exact_and_no_dead_rows():
    """Rank 4 on a module with 2 outputs: only 2 components exist. svd_spectrum rotated the zero padding
    into the real components (its singular values came out smaller than S exp(strength z)), and every
    ΔW-space operator returned zero A rows beside zero B columns, which no gradient can revive."""
    g = torch.Generator().manual_seed(1)
    parent = {"m.x.lora_A.weight": torch.randn(4, 6, generator=g, dtype=torch.float64),
              "m.x.lora_B.weight": torch.randn(2, 4, generator=g, dtype=torch.float64)}  # fmt: skip
    dense = parent["m.x.lora_B.weight"] @ parent["m.x.lora_A.weight"]
    for strength in (0.3, 1.0):
        z = torch.randn((1, 4), generator=torch.Generator().manual_seed(3), dtype=torch.float64)[0]
        expected = (torch.linalg.svdvals(dense) * torch.exp(strength * z[:2])).sort(descending=True).values
        child = mutate("svd_spectrum", parent, seed=3, strength=strength)
        got = torch.linalg.svdvals(child["m.x.lora_B.weight"] @ child["m.x.lora_A.weight"])
        torch.testing.assert_close(got, expected)
    fresh = {**parent, "m.x.lora_B.weight": torch.zeros(2, 4, dtype=torch.float64)}
    for child in (
        mutate("svd_spectrum", fresh),
        cross("interpolate", [fresh, fresh]),
        cross("es", [parent, fresh]),
    ):
        assert (child["m.x.lora_A.weight"].norm(dim=1) > 0.5).all()
    assert_same_delta(cross("interpolate", [parent, parent]), parent)


def test_operators_take_their_first_argument_by_keyword_too():
    parents = [lora_genome(1), lora_genome(2)]
    by_position = mutate("gaussian", parents[0], seed=4)
    by_keyword = operators.MUTATIONS["gaussian"](genome=parents[0], rng=torch.Generator().manual_seed(4))
    assert all(torch.equal(by_keyword[k], v) for k, v in by_position.items())
    child = operators.CROSSOVERS["interpolate"](parents=parents, rng=torch.Generator().manual_seed(4))
    assert_same_structure(child, parents[0])
    with pytest.raises(TypeError, match="genome"):
        operators.MUTATIONS["gaussian"](rng=torch.Generator())


@pytest.mark.parametrize("name", sorted(operators.LORA_ONLY))
def test_lora_only_operators_reject_a_plain_genome(name):
    genome = plain_net(0).state_dict()
    with pytest.raises(ValueError, match="needs a LoRA genome"):
        if name in operators.MUTATIONS:
            mutate(name, genome)
        else:
            cross(name, [genome, plain_net(1).state_dict()])


def test_a_bare_lora_layer_s_factors_are_lora_pairs():
    """One LoRA layer's own parameters have no module in front (``lora_A.weight``; its ``state_dict()``:
    ``lora_A.default.weight`` beside ``base_layer.weight``): they were taken for a plain genome, averaged entry
    by entry, and mutations changed the frozen base weight (a review)."""
    g = torch.Generator().manual_seed(0)
    layer = {"base_layer.weight": torch.randn(6, 5, generator=g), "lora_A.default.weight": torch.randn(2, 5, generator=g),
             "lora_B.default.weight": torch.randn(6, 2, generator=g)}  # fmt: skip
    (pair,) = lora_pairs(layer)
    assert (pair.module, pair.a_key, pair.b_key) == ("", "lora_A.default.weight", "lora_B.default.weight")
    for name in operators.MUTATIONS:
        child = mutate(name, layer, strength=0.1)
        assert torch.equal(child["base_layer.weight"], layer["base_layer.weight"]), name
    gauge = torch.diag(torch.tensor([2.0, 0.5]))  # the same ΔW in another gauge: B M⁻¹ · M A
    ours = {key.replace(".default", ""): value for key, value in layer.items() if "lora" in key}
    theirs = {
        "lora_A.weight": gauge @ ours["lora_A.weight"],
        "lora_B.weight": ours["lora_B.weight"] @ gauge.inverse(),
    }
    assert [p.module for p in lora_pairs(ours)] == [""]
    assert_same_delta(cross("interpolate", [ours, theirs], weight=0.5), ours)  # factors averaged: 1.125 ΔW
    embedding = {
        "lora_embedding_A": torch.randn(2, 9, generator=g),
        "lora_embedding_B": torch.randn(4, 2, generator=g),
    }
    assert [(p.module, p.b_key) for p in lora_pairs(embedding)] == [("", "lora_embedding_B")]


def test_pair_discovery_accepts_adapter_names_and_rejects_orphans():
    genome = {"m.q.lora_A.default.weight": torch.zeros(2, 5), "m.q.lora_B.default.weight": torch.zeros(7, 2)}
    (pair,) = lora_pairs(genome)
    assert (pair.module, pair.b_key) == ("m.q", "m.q.lora_B.default.weight")
    with pytest.raises(ValueError, match=r"m\.q\.lora_A\.weight"):
        lora_pairs({"m.q.lora_A.weight": torch.zeros(2, 5)})
    with pytest.raises(ValueError, match="disagree on rank"):
        lora_pairs({"m.q.lora_A.weight": torch.zeros(2, 5), "m.q.lora_B.weight": torch.zeros(7, 3)})
    with pytest.raises(ValueError, match="exactly 2 parents"):
        check_parents([genome], count=2)


# --- low-rank algebra --------------------------------------------------------------------------


def test_lowrank_svd_matches_dense_singular_values():
    g = torch.Generator().manual_seed(0)
    b, a = torch.randn(3, 50, 6, generator=g), torch.randn(3, 6, 30, generator=g)
    svd = lowrank.lowrank_svd(b, a)
    torch.testing.assert_close(svd.s, torch.linalg.svdvals(b @ a)[:, :6], rtol=1e-4, atol=1e-4)


def test_reprojection_is_exact_when_the_rank_fits_and_optimal_otherwise():
    g = torch.Generator().manual_seed(0)
    bs = [torch.randn(2, 40, 3, generator=g) for _ in range(2)]
    as_ = [torch.randn(2, 3, 30, generator=g) for _ in range(2)]
    dense = 0.3 * bs[0] @ as_[0] - 1.2 * bs[1] @ as_[1]  # rank 6
    b, a = lowrank.reproject(bs, as_, [0.3, -1.2], rank=6)
    torch.testing.assert_close(b @ a, dense, atol=1e-4, rtol=1e-4)
    b, a = lowrank.reproject(bs, as_, [0.3, -1.2], rank=4)  # truncated: Eckart-Young optimum
    u, s, vh = torch.linalg.svd(dense)
    torch.testing.assert_close(b @ a, u[..., :4] * s[:, None, :4] @ vh[..., :4, :], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(b.norm(dim=-2), a.norm(dim=-1))  # balanced gauge: √S on both sides


def test_factor_product_expansion_equals_the_reflectors_and_falls_back_per_matrix(monkeypatch):
    """``to_factors`` expands through ``X @ R⁻¹`` where that is accurate: same factors as ``ormqr``; a
    zero ``B`` in the batch (a fresh adapter: null components) takes the reflectors, the others do not.
    A rank-deficient but non-zero factor (a parent crossed with itself) stays on the fast path: the
    expanded vectors avoid its deficient direction, which the check measures."""
    g = torch.Generator().manual_seed(0)
    b, a = torch.randn(3, 40, 8, generator=g), torch.randn(3, 8, 30, generator=g)
    b[1] = 0.0  # a fresh adapter's B
    b[2, :, 4:] = b[2, :, :4]  # [B, B], like a parent crossed with itself
    svd = lowrank.lowrank_svd(b, a)
    u, s, v = (lowrank.take_columns(x, 4) for x in (svd.u, svd.s, svd.v))
    accurate = lowrank.coordinates(svd.b_reflectors, u)
    assert accurate is not None and accurate[1].tolist() == [True, False, True]
    fast = lowrank.to_factors(svd, u, s, v, lowrank.row_scale(a))
    monkeypatch.setattr(lowrank, "MAX_AMPLIFICATION", 0.0)  # every matrix through the reflectors
    slow = lowrank.to_factors(svd, u, s, v, lowrank.row_scale(a))
    for ours, reference in zip(fast, slow, strict=True):
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-4)
    dense_u, dense_s, dense_vh = torch.linalg.svd(b @ a)  # Eckart-Young: the best rank-4 approximation
    best = dense_u[..., :4] * dense_s[:, None, :4] @ dense_vh[..., :4, :]
    torch.testing.assert_close(fast[0] @ fast[1], best, atol=1e-4, rtol=1e-4)


def best_rank(dense: torch.Tensor, rank: int) -> torch.Tensor:
    """Eckart-Young: the best rank-``rank`` approximation of each matrix of ``dense``, in float64."""
    u, s, vh = torch.linalg.svd(dense.double(), full_matrices=False)
    return u[..., :rank] * s[..., None, :rank] @ vh[..., :rank, :]


def test_reprojection_is_near_optimal_at_every_conditioning():
    """Two related parents (``B_2 = B_1 + δ``, ``A_2 = A_1 + δ'``) from unrelated to identical, as
    crossovers within one lineage produce: the re-projection stays the Eckart-Young optimum to float32
    rounding however ill-conditioned the concatenated factors are. A cheaper triangular factor taken from
    the Gram matrix without a conditioning check fails it (6e-3 off at δ = 1e-4, tried here)."""
    g = torch.Generator().manual_seed(1)
    for relative in (1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-6, 1e-8, 0.0):
        b1, a1 = torch.randn(2, 600, 16, generator=g) * 0.01, torch.rand(2, 16, 400, generator=g) - 0.5
        b2 = b1 + relative * torch.randn(2, 600, 16, generator=g) * 0.01
        a2 = a1 + relative * (torch.rand(2, 16, 400, generator=g) - 0.5)
        b, a = lowrank.reproject([b1, b2], [a1, a2], [0.5, 0.5], rank=16)
        best = best_rank(0.5 * b1.double() @ a1.double() + 0.5 * b2.double() @ a2.double(), 16)
        error = ((b.double() @ a.double()) - best).norm(dim=(-2, -1)) / best.norm(dim=(-2, -1))
        assert error.max() < 1e-5, (relative, error)


def _related_stacks(relative: float, decay: tuple[float, float], count: int, m: int, n: int, seed: int):
    """``count`` pairs ``(B_1, A_1)`` and ``(B_1 + δ, A_1 + δ')`` with ``‖δ‖ = relative * ‖B_1‖``, from unrelated
    parents to a child and its parent; ``B``'s singular values fall by ``10**-decay[0]`` across the rank and
    ``A``'s by ``10**-decay[1]`` (a trained adapter's ``B`` falls, its ``A`` stays near its random start)."""
    g = torch.Generator().manual_seed(seed)

    def spectral(rows: int, fall: float) -> torch.Tensor:
        left = torch.linalg.qr(torch.randn(count, rows, RANK, generator=g)).Q
        right = torch.linalg.qr(torch.randn(count, RANK, RANK, generator=g)).Q
        return left * torch.logspace(0, -fall, RANK) @ right

    b1, a1 = spectral(m, decay[0]) * 0.01, spectral(n, decay[1]).mT
    return [b1, b1 + relative * spectral(m, decay[0]) * 0.01], [a1, a1 + relative * spectral(n, decay[1]).mT]


def test_gram_reprojection_is_optimal_where_it_is_taken_and_householder_elsewhere():
    """``reproject_concatenated`` decomposes well-conditioned stacks from their Gram matrices and the rest by
    Householder QR: every child is the Eckart-Young optimum to float32 rounding, over related and unrelated
    parents with flat and falling spectra. Both paths are taken: unrelated flat parents through the Gram
    matrices; a child with its parent at 1e-4, and a ``B`` whose spectrum falls 1000-fold (its Gram
    matrix loses what the small components need: 1.3e-5 off when taken), by Householder QR."""
    taken = {}
    for relative, decay, coeffs in [
        (1.0, (0, 0), (0.5, 0.5)), (1.0, (1, 1), (1.3, -0.3)), (1.0, (2, 2), (0.99, 0.01)),
        (0.3, (0, 0), (0.75, 0.25)), (0.1, (1, 1), (0.5, 0.5)), (0.03, (0, 0), (1.3, -0.3)),
        (1e-2, (2, 2), (0.5, 0.5)), (1e-4, (0, 0), (0.5, 0.5)), (0.0, (0, 0), (0.5, 0.5)),
        (1.0, (3, 0), (0.99, 0.01)), (0.3, (3, 0), (1.3, -0.3)),
    ]:  # fmt: skip
        bs, as_ = _related_stacks(relative, decay, 3, 600, 400, seed=int(relative * 1e4) + decay[0])
        b_cat = torch.cat([c * b for c, b in zip(coeffs, bs, strict=True)], dim=-1)
        a_cat = torch.cat(as_, dim=-2)
        gram = (
            lowrank._gram_triangle(b_cat.mT @ b_cat).accepted
            & lowrank._gram_triangle(a_cat @ a_cat.mT).accepted
        )
        taken[(relative, decay)] = gram.tolist()
        b, a = lowrank.reproject_concatenated(b_cat, a_cat, RANK)
        best = best_rank(
            sum(c * x.double() @ y.double() for c, x, y in zip(coeffs, bs, as_, strict=True)), RANK
        )
        error = ((b.double() @ a.double()) - best).norm(dim=(-2, -1)) / best.norm(dim=(-2, -1))
        assert error.max() < 1e-5, (relative, decay, coeffs, error)
    assert taken[(1.0, (0, 0))] == [True] * 3, taken
    assert taken[(1e-4, (0, 0))] == taken[(1.0, (3, 0))] == taken[(0.3, (3, 0))] == [False] * 3, taken


def test_crossovers_take_the_gram_path_for_independent_parents_and_householder_for_a_near_clone(monkeypatch):
    """The path README and bench/operators.py name for each case: independent parents (the benchmark's) never
    reach Householder QR in ``interpolate`` or ``svd_splice``; a parent with a near-clone of it (1e-3 noise)
    reaches it for every module."""
    householder: list[int] = []
    original = lowrank.lowrank_svd
    monkeypatch.setattr(lowrank, "lowrank_svd", lambda b, a: householder.append(b.shape[0]) or original(b, a))
    parents = [lora_genome(1), lora_genome(2)]
    for name in ("interpolate", "svd_splice"):
        cross(name, parents)
    assert householder == []
    g = torch.Generator().manual_seed(3)
    clone = {k: v + 1e-3 * v.std() * torch.randn(v.shape, generator=g) for k, v in parents[0].items()}
    cross("interpolate", [parents[0], clone], weight=0.5)
    assert sum(householder) == len(lora_pairs(clone))


def test_gram_reprojection_falls_back_per_matrix(monkeypatch):
    """In one batch, matrices the Gram path takes and one it does not (one parent's ``B`` is zero, a fresh
    adapter: the stack has rank r): each child is the same as with Householder QR alone, in its own slot."""
    bs, as_ = _related_stacks(1.0, (0, 0), 3, 200, 150, seed=4)
    bs[1][1] = 0.0
    b_cat, a_cat = torch.cat([0.6 * bs[0], 0.4 * bs[1]], dim=-1), torch.cat(as_, dim=-2)
    accepted = lowrank._gram_triangle(b_cat.mT @ b_cat).accepted
    assert accepted.tolist() == [True, False, True]
    mixed = lowrank.reproject_concatenated(b_cat, a_cat, RANK)
    monkeypatch.setattr(lowrank, "GRAM_MAX_CONDITION", 0.0)  # nothing through the Gram path
    householder = lowrank.reproject_concatenated(b_cat, a_cat, RANK)
    # the same child up to the sign of each component (singular vectors are defined up to sign)
    torch.testing.assert_close(mixed[0] @ mixed[1], householder[0] @ householder[1], atol=1e-7, rtol=1e-4)
    for ours, reference, dim in zip(mixed, householder, (-2, -1), strict=True):
        torch.testing.assert_close(ours.norm(dim=dim), reference.norm(dim=dim), atol=1e-6, rtol=1e-4)


def test_gram_reprojection_edge_cases():
    """The Gram path keeps what Householder QR gave (found by a review of it): an output rank above the
    concatenated width (extra components: zero ``B`` columns, typical ``A`` rows; they copied real ones),
    float64 factors of 1e150 (the core's square overflowed inside ``eigh``: a raw LAPACK error), factors
    whose Gram entries are subnormal (accepted and 0.1 off), and an empty batch (an UnboundLocalError)."""
    g = torch.Generator().manual_seed(0)
    b, a = torch.randn(2, 40, 4, generator=g), torch.randn(2, 4, 30, generator=g)
    child_b, child_a = lowrank.reproject([b], [a], [1.0], rank=8)
    torch.testing.assert_close(child_b @ child_a, b @ a, atol=1e-4, rtol=1e-5)
    assert torch.count_nonzero(child_b[..., 4:]) == 0 and (child_a[:, 4:].norm(dim=-1) > 1).all()

    def relative_error(
        child: dict[str, torch.Tensor], parents: list[dict[str, torch.Tensor]], scale: float
    ) -> float:
        worst = 0.0
        for module, dw in delta_w(child).items():
            target = sum(0.5 * delta_w(p)[module] / scale for p in parents)
            best = best_rank(target, RANK)
            worst = max(worst, float((dw / scale - best).norm() / best.norm()))
        return worst

    huge = [lora_genome(seed, torch.float64) for seed in (1, 2)]
    for parent in huge:
        for key in parent:
            parent[key] = parent[key] * 1e150
    assert relative_error(cross("interpolate", huge, weight=0.5), huge, 1e300) < 1e-12
    tiny = [lora_genome(seed) for seed in (1, 2)]
    for parent in tiny:
        for key in parent:
            if ".lora_B." in key:
                parent[key] = parent[key] * 1e-20
    assert relative_error(cross("interpolate", tiny, weight=0.5), tiny, 1e-20) < 1e-5
    empty = lowrank.reproject([b[:0]], [a[:0]], [1.0], rank=4)
    assert empty[0].shape == (0, 40, 4) and empty[1].shape == (0, 4, 30)


def test_null_components_keep_a_trainable_a_row():
    """A fresh adapter (B = 0) through a ΔW-space operator must not come back with A = 0 too."""
    parents = [lora_genome(1), lora_genome(2)]
    for parent in parents:
        for key in parent:
            if "lora_B" in key:
                parent[key].zero_()
    for child in (cross("interpolate", parents), mutate("svd_spectrum", parents[0])):
        for pair in lora_pairs(child):
            assert torch.count_nonzero(child[pair.b_key]) == 0
            assert (child[pair.a_key].norm(dim=-1) > 0.5).all()  # rows keep the parents' typical norm


# --- each operator does what its definition says --------------------------------------------------


def test_interpolation_endpoints_reproduce_a_parents_delta_w():
    parents = [lora_genome(1), lora_genome(2)]
    assert_same_delta(cross("interpolate", parents, weight=0.0), parents[0])
    assert_same_delta(cross("interpolate", parents, weight=1.0), parents[1])
    child, dense = delta_w(cross("interpolate", parents, weight=0.3)), delta_w(parents[0])
    for module, dw in delta_w(parents[1]).items():
        target = 0.7 * dense[module] + 0.3 * dw
        u, s, vh = torch.linalg.svd(target)
        best = u[:, :RANK] * s[:RANK] @ vh[:RANK]
        torch.testing.assert_close(child[module], best, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("zero_b", [False, True])
def test_svd_splice_takes_top_components_of_the_better_parent(zero_b):
    # 20 layers: each shape's batch is split into units of CHUNK_PAIRS, so every module must still get
    # its own k, the one drawn for it (replayed from the seed: one draw per batch, in batch order).
    # zero_b: every third module of the worse parent is a fresh adapter (B = 0), which the factor
    # product cannot expand (the reflectors do, for that module only).
    parents = chunked_parents()
    if zero_b:
        for pair in lora_pairs(parents[0])[::3]:
            parents[0][pair.b_key].zero_()
    child = delta_w(cross("svd_splice", parents, seed=5, fitness=(0.0, 1.0)))  # parent 1 is better
    top, rest = delta_w(parents[1]), delta_w(parents[0])
    replay = torch.Generator().manual_seed(5)
    drawn = {}
    for batch in pair_batches(parents[0], lora_pairs(parents[0])):
        k = torch.randint(1, RANK, (len(batch.pairs),), generator=replay)
        drawn.update({pair.module: int(k_j) for pair, k_j in zip(batch.pairs, k, strict=True)})
    assert len(set(drawn.values())) > 1
    for module, dw in child.items():
        k = drawn[module]
        expected = best_rank(top[module], k) + rest[module] - best_rank(rest[module], k)
        torch.testing.assert_close(dw, expected, atol=1e-5, rtol=1e-4, msg=module)


def _shut_down_pool() -> None:
    for pool in genome._POOLS.values():
        pool.shutdown()
    genome._POOLS.clear()


@pytest.mark.parametrize(
    "name", ["interpolate", "extrapolate", "es", "svd_splice", "svd_spectrum", "component_mask"]
)
def test_parallel_units_give_the_sequential_child_bit_for_bit(name):
    """The ΔW-space operators run their units on threads when torch may use several: the child must not
    depend on that (nor on which unit finishes first), and the caller's thread count stays as it was."""
    parents = chunked_parents()

    def run():
        if name in operators.MUTATIONS:
            return mutate(name, parents[0], seed=3, strength=0.3)
        return cross(name, parents, seed=3)

    with torch_threads(1):
        sequential = run()
    with torch_threads(2):
        _shut_down_pool()
        parallel = run()
        assert list(genome._POOLS) == [2], "the units did not run on the pool"
        assert torch.get_num_threads() == 2
    assert list(parallel) == list(sequential)
    for key, tensor in sequential.items():
        assert torch.equal(parallel[key], tensor), key


def test_every_operator_gives_the_same_child_at_one_and_two_threads():
    """Large tensors make torch split its reductions over threads, in an order that can move the last bit
    of a float sum (``neftune_a``'s RMS of a Qwen down_proj-shaped ``A`` did, for 3 genomes in 10)."""
    names = [*operators.MUTATIONS, *operators.CROSSOVERS]
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        parents = [
            {"m.down_proj.lora_A.weight": torch.randn(16, 4864, generator=g) * 0.03,
             "m.down_proj.lora_B.weight": torch.randn(896, 16, generator=g) * 0.01}
            for _ in range(2)
        ]  # fmt: skip
        children = {}
        for threads in (1, 2):
            with torch_threads(threads):
                children[threads] = [
                    mutate(n, parents[0], seed=seed, strength=0.3) if n in operators.MUTATIONS
                    else cross(n, parents, seed=seed)
                    for n in names
                ]  # fmt: skip
        for name, one, two in zip(names, children[1], children[2], strict=True):
            for key in one:
                assert torch.equal(one[key], two[key]), (name, seed, key)


@pytest.mark.parametrize("own_setters", [True, False], ids=["thread-setters", "torch-set-num-threads"])
def test_run_parallel_runs_units_on_one_thread_each_and_reports_the_first_failure(own_setters, monkeypatch):
    """Both ways a worker sets itself to one thread: OpenMP's and MKL's own-thread setters where they are
    found, ``torch.set_num_threads`` (and the pool's reset of the default) where not."""
    if own_setters and genome._SETTERS is None:
        pytest.skip("this torch links no OpenMP setter that ctypes can find")
    if not own_setters:
        monkeypatch.setattr(genome, "_SETTERS", None)
    units = list(range(6))
    seen = {}

    def work(unit):
        seen[unit] = torch.get_num_threads()
        if unit in (2, 4):
            raise ValueError(f"unit {unit}")

    with torch_threads(2):
        _shut_down_pool()
        with pytest.raises(ValueError, match="unit 2"):
            genome.run_parallel(work, units, [1] * 6, torch.device("cpu"))
        assert torch.get_num_threads() == 2
        assert seen == dict.fromkeys(units, 1), "every unit runs, each with torch on one thread"
    seen.clear()
    with torch_threads(1):
        genome.run_parallel(work, [0, 1], [1, 1], torch.device("cpu"))
    assert seen == {0: 1, 1: 1}


def test_operators_called_from_several_threads_at_once_leave_torchs_thread_counts_alone():
    """torch's thread count is per thread, and a thread takes the last count set anywhere when it first
    uses torch: neither the callers' counts nor that default may end up at the workers' one."""
    from concurrent.futures import ThreadPoolExecutor

    parents = chunked_parents()
    with torch_threads(1):
        expected = [cross("interpolate", parents), mutate("svd_spectrum", parents[0])]
    with torch_threads(2):
        _shut_down_pool()  # the first call below starts it, from one of the callers
        with ThreadPoolExecutor(4) as callers:
            for _ in range(5):
                calls = [
                    callers.submit(cross, "interpolate", parents),
                    callers.submit(mutate, "svd_spectrum", parents[0]),
                    callers.submit(cross, "interpolate", parents),
                    callers.submit(mutate, "svd_spectrum", parents[0]),
                ]
                children = [call.result() for call in calls]
                assert torch.get_num_threads() == 2
                with ThreadPoolExecutor(1) as fresh:  # a thread starting now takes torch's process-wide count
                    assert fresh.submit(torch.get_num_threads).result() == 2
                assert all(count == 2 for count in callers.map(lambda _: torch.get_num_threads(), range(8)))
                for child, reference in zip(children, expected * 2, strict=True):
                    assert all(torch.equal(child[key], reference[key]) for key in reference)


def test_run_parallel_runs_in_order_in_the_caller_without_per_thread_counts(monkeypatch):
    monkeypatch.setattr(genome, "_PER_THREAD_COUNTS", False)
    ran = []
    with torch_threads(2):
        genome.run_parallel(
            lambda unit: ran.append((unit, threading.get_ident())), [0, 1, 2], [1, 2, 3], torch.device("cpu")
        )
    assert ran == [(unit, threading.get_ident()) for unit in (0, 1, 2)]


def _splice_in_child(queue, parents) -> None:
    torch.set_num_threads(2)
    queue.put(sum(float(t.sum()) for t in cross("svd_splice", parents).values()))


def test_a_forked_child_starts_its_own_worker_pool():
    """A fork keeps the parent's pool object but none of its threads: without a fresh pool in the child,
    its first parallel operator would wait forever."""
    import multiprocessing

    parents = chunked_parents()
    with torch_threads(2):
        expected = sum(float(t.sum()) for t in cross("svd_splice", parents).values())
        assert genome._POOLS
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_splice_in_child, args=(queue, parents))
        child.start()
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            pytest.fail("the forked child hung in its first parallel operator")
    assert child.exitcode == 0
    assert queue.get(timeout=5) == expected


def test_svd_spectrum_at_zero_strength_keeps_delta_w_and_changes_it_otherwise():
    parent = lora_genome(1)
    assert_same_delta(mutate("svd_spectrum", parent, strength=0.0), parent)
    moved = delta_w(mutate("svd_spectrum", parent, strength=0.3))
    original = delta_w(parent)
    for module, dw in original.items():
        ratio = float((moved[module] - dw).norm() / dw.norm())
        assert 0.02 < ratio < 1.5, module
        # the singular bases rotate within the adapter's spaces: without the rotations (spectrum noise
        # alone) every new singular vector is, up to sign, an old one; with them some are mixtures
        for old_side, new_side in ((dw, moved[module]), (dw.mT, moved[module].mT)):
            u_old = torch.linalg.svd(old_side, full_matrices=False)[0][:, :RANK]
            u_new = torch.linalg.svd(new_side, full_matrices=False)[0][:, :RANK]
            best_match = (u_old.mT @ u_new).abs().amax(dim=0)  # per new vector, its closest old one
            assert float(best_match.min()) < 0.999, module


def test_component_mask_drops_components_but_keeps_a_rows():
    parent = lora_genome(1)
    assert_same_delta(mutate("component_mask", parent, strength=0.0), parent)
    empty = mutate("component_mask", parent, strength=1.0)
    for pair in lora_pairs(empty):
        assert torch.count_nonzero(empty[pair.b_key]) == 0
        assert (empty[pair.a_key].norm(dim=-1) > 0).all()
    half = mutate("component_mask", lora_genome(1, layers=8), strength=0.5)
    ranks = [int(torch.linalg.matrix_rank(dw.float())) for dw in delta_w(half).values()]
    assert min(ranks) < RANK and 0 < sum(ranks) < RANK * len(ranks)


def test_gaussian_noise_is_scaled_to_each_tensors_spread():
    parent = {"big.weight": torch.randn(400, 300) * 5.0, "small.weight": torch.randn(400, 300) * 0.01}
    parent["zero.bias"] = torch.zeros(10)
    child = mutate("gaussian", parent, strength=0.1)
    for key in ("big.weight", "small.weight"):
        relative = float((child[key] - parent[key]).std() / parent[key].std())
        assert abs(relative - 0.1) < 0.005, key
    assert torch.equal(child["zero.bias"], parent["zero.bias"])


def test_layer_gaussian_changes_whole_chosen_modules_only():
    parent = lora_genome(1, layers=4)  # 16 modules, fraction 0.25 -> 4
    child = mutate("layer_gaussian", parent, strength=0.1, fraction=0.25)
    changed = {
        p.module: (
            not torch.equal(child[p.a_key], parent[p.a_key]),
            not torch.equal(child[p.b_key], parent[p.b_key]),
        )
        for p in lora_pairs(parent)
    }
    assert sum(a for a, _ in changed.values()) == 4
    assert all(a == b for a, b in changed.values())


def test_neftune_noise_touches_a_only_within_its_bound():
    parent = lora_genome(1)
    child = mutate("neftune_a", parent, strength=0.1)
    for pair in lora_pairs(parent):
        a = parent[pair.a_key]
        assert torch.equal(child[pair.b_key], parent[pair.b_key])
        bound = 3**0.5 * 0.1 * float(a.square().mean().sqrt())
        noise = child[pair.a_key] - a
        assert 0 < float(noise.abs().max()) <= bound * (1 + 1e-5)
        # U(-bound, bound): both signs alike, mean near 0, RMS bound / √3 (= strength * RMS(A))
        assert abs(float(noise.mean())) < 0.1 * bound and 0.4 < float((noise > 0).float().mean()) < 0.6
        assert abs(float(noise.square().mean().sqrt()) / (bound / 3**0.5) - 1) < 0.15


def test_uniform_takes_each_lora_module_whole_from_one_parent():
    parents = [lora_genome(1, layers=4), lora_genome(2, layers=4)]
    child = cross("uniform", parents)
    sources = []
    for pair in lora_pairs(child):
        source = [i for i, p in enumerate(parents) if torch.equal(child[pair.a_key], p[pair.a_key])]
        assert len(source) == 1 and torch.equal(child[pair.b_key], parents[source[0]][pair.b_key])
        sources.append(source[0])
    assert 0 < sum(sources) < len(sources)


def test_dare_without_dropping_is_the_mean_and_with_a_base_rescales_deltas():
    parents = [lora_genome(1), lora_genome(2)]
    mean = cross("dare", parents, drop=0.0)
    for key in mean:
        torch.testing.assert_close(mean[key], (parents[0][key] + parents[1][key]) / 2)
    base = {k: torch.zeros_like(t) for k, t in parents[0].items()}
    child = cross("dare", [parents[0]], fitness=None, drop=0.75, base=base)
    key = next(iter(child))
    kept = child[key] != 0
    assert 0.1 < float(kept.float().mean()) < 0.45
    torch.testing.assert_close(child[key][kept], 4 * parents[0][key][kept])
    # several parents, an explicit base, drops: every entry is base + Σ_i m_i δ_i / (n (1 - p)) for some
    # keep masks m_i; with two parents and p = 1/2 each entry is one of base + {0, δ_1, δ_2, δ_1 + δ_2}
    base = lora_genome(3)
    child = cross("dare", parents, fitness=None, drop=0.5, base=base)
    counts = torch.zeros(4)
    for key in child:
        d1, d2 = parents[0][key] - base[key], parents[1][key] - base[key]
        options = torch.stack([torch.zeros_like(d1), d1, d2, d1 + d2]) + base[key]
        distance = (options - child[key]).abs().amin(dim=0)
        assert float(distance.max()) < 1e-5, key  # each entry is one of the four sums
        counts += torch.bincount((options - child[key]).abs().argmin(dim=0).flatten(), minlength=4)
    share = counts / counts.sum()
    assert float((share - 0.25).abs().max()) < 0.03, share  # each keep pattern for about a quarter


def test_fitness_orders_extrapolate_es_and_clone_mutate_on_plain_genomes():
    better, worse = plain_net(0).state_dict(), plain_net(1).state_dict()
    key = "0.weight"
    child = cross("extrapolate", [worse, better], fitness=(0.0, 1.0))
    step = (child[key] - better[key]) / (better[key] - worse[key])
    assert 0 <= float(step.mean()) <= 0.5 and float(step.std()) < 1e-4
    es = cross("es", [worse, better], fitness=(0.0, 1.0))
    torch.testing.assert_close(es[key], 0.75 * better[key] + 0.25 * worse[key])
    with pytest.raises(ValueError, match="fitness"):
        cross("es", [worse, better], fitness=None)
    clone = cross("clone_mutate", [worse, better], fitness=(0.0, 1.0), strength=0.01)
    assert (clone[key] - better[key]).norm() < 0.1 * (clone[key] - worse[key]).norm()
    assert crossovers.centred_ranks([3.0, 1.0, 3.0]) == [0.25, -0.5, 0.25]


def test_extrapolate_draws_its_step_uniformly_within_max_step():
    """A mutation audit: a step fixed at ``max_step`` (no draw) was caught only weakly. ``eta ~ U(0,
    max_step)``, one draw per child: over seeds the steps stay in ``[0, max_step]`` and spread over it."""
    better, worse = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([0.0, 0.0])}
    steps = []
    for seed in range(32):
        child = cross("extrapolate", [worse, better], seed=seed, fitness=(0.0, 1.0), max_step=2.0)
        step = (child["w"] - better["w"]) / (better["w"] - worse["w"])
        assert float(step[0]) == pytest.approx(float(step[1]), abs=1e-6)  # one draw for the whole child
        steps.append(float(step[0]))
    assert min(steps) >= 0.0 and max(steps) <= 2.0
    assert min(steps) < 0.5 and max(steps) > 1.5, steps


# --- real modules: plain nets and PEFT --------------------------------------------------------


@pytest.mark.parametrize("name", DENSE_MUTATIONS + DENSE_CROSSOVERS)
def test_plain_genome_loads_into_its_module_and_runs(name):
    nets = [plain_net(0), plain_net(1)]
    parents = [net.state_dict() for net in nets]
    child = mutate(name, parents[0], strength=0.2) if name in operators.MUTATIONS else cross(name, parents)
    assert_same_structure(child, parents[0])
    assert torch.equal(child["1.num_batches_tracked"], parents[0]["1.num_batches_tracked"])
    net = plain_net(2)
    net.load_state_dict(child)
    out = net.eval()(torch.randn(5, 6, generator=torch.Generator().manual_seed(0)))
    assert torch.isfinite(out).all()


class Toy(nn.Module):
    """A tiny transformer-block-shaped net whose Linear names match the LoRA targets."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(24, 24), nn.Linear(24, 8)
        self.up_proj, self.down_proj = nn.Linear(24, 40), nn.Linear(40, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.q_proj(x) + self.k_proj(x).repeat(1, 3)
        return self.down_proj(torch.relu(self.up_proj(h)))


@pytest.fixture(scope="module")
def peft_population():
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    config = LoraConfig(r=RANK, lora_alpha=8, target_modules=list(SHAPES), init_lora_weights=False)
    models = []
    for seed in range(2):
        torch.manual_seed(seed)  # test-local: same base weights for both, different adapters below
        base = Toy()
        torch.manual_seed(100 + seed)
        models.append(get_peft_model(base, config))
    return models, [get_peft_model_state_dict(m) for m in models]


@pytest.mark.parametrize("name", sorted(operators.MUTATIONS) + PAIRED)
def test_child_loads_into_peft_and_runs(name, peft_population):
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    models, genomes = peft_population
    assert len(lora_pairs(genomes[0])) == len(SHAPES)
    child = mutate(name, genomes[0], strength=0.2) if name in operators.MUTATIONS else cross(name, genomes)
    model = copy.deepcopy(models[0])
    result = set_peft_model_state_dict(model, child)
    assert not result.unexpected_keys
    loaded = get_peft_model_state_dict(model)
    assert all(torch.equal(loaded[k], child[k]) for k in child)
    x = torch.randn(3, 24, generator=torch.Generator().manual_seed(0))
    out = model(x)
    assert out.shape == (3, 24) and torch.isfinite(out).all()
    assert not torch.allclose(out, models[0](x)), "the child behaves exactly like its parent"


class Embedded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.proj = nn.Embedding(50, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.embed(x))


def test_peft_embedding_factors_are_lora_pairs():
    """PEFT names an adapted nn.Embedding's factors ``lora_embedding_A`` / ``lora_embedding_B`` (no
    ``.weight``): they were taken for plain entries, left alone by mutations and copied by crossovers."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    config = LoraConfig(r=4, target_modules=["embed", "proj"], init_lora_weights=False)
    models = []
    for seed in range(2):
        torch.manual_seed(seed)  # test-local model construction only
        models.append(get_peft_model(Embedded(), config))
    genomes = [get_peft_model_state_dict(m) for m in models]
    a_key, b_key = "base_model.model.embed.lora_embedding_A", "base_model.model.embed.lora_embedding_B"
    assert (lora_pairs(genomes[0])[0].a_key, lora_pairs(genomes[0])[0].b_key) == (a_key, b_key)
    raw = {k: v for k, v in models[0].state_dict().items() if "lora_" in k}  # adapter name in the keys
    assert len(lora_pairs(raw)) == 2
    for name in [*operators.MUTATIONS, *operators.CROSSOVERS]:
        if name in operators.MUTATIONS:
            child = mutate(name, genomes[0], strength=0.5)
        else:
            child = cross(name, genomes, fitness=(0.0, 1.0))
        model = copy.deepcopy(models[0])
        assert not set_peft_model_state_dict(model, child).unexpected_keys
        assert torch.isfinite(model(torch.arange(10).view(2, 5))).all()
        if name not in ("uniform", "dare"):  # uniform may pick parent 0's module; dare keeps some entries
            assert not torch.equal(child[b_key] @ child[a_key], genomes[0][b_key] @ genomes[0][a_key]), name
    child = cross("interpolate", genomes, weight=0.5)
    mixed = sum(0.5 * g[b_key].double() @ g[a_key].double() for g in genomes)
    torch.testing.assert_close(
        (child[b_key] @ child[a_key]).double(), best_rank(mixed, 4), atol=1e-5, rtol=1e-4
    )


@pytest.mark.parametrize("name", ["interpolate", "svd_splice", "svd_spectrum", "component_mask"])
def test_fresh_adapters_stay_trainable_after_a_delta_w_operator(name, peft_population):
    """PEFT starts adapters at B = 0; a ΔW-space child of such adapters must still get a gradient on B."""
    from peft import set_peft_model_state_dict

    models, genomes = peft_population
    fresh = [{k: torch.zeros_like(t) if "lora_B" in k else t for k, t in g.items()} for g in genomes]
    child = mutate(name, fresh[0], strength=1.0) if name in operators.MUTATIONS else cross(name, fresh)
    model = copy.deepcopy(models[0])
    set_peft_model_state_dict(model, child)
    model(torch.randn(3, 24, generator=torch.Generator().manual_seed(0))).square().sum().backward()
    for module_name, parameter in model.named_parameters():
        if "lora_B" in module_name:
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, module_name


@pytest.mark.parametrize("name", sorted(operators.MUTATIONS) + PAIRED)
def test_parameters_that_require_grad_give_the_same_plain_child(name):
    """A genome of ``requires_grad`` parameters (``dict(module.named_parameters())``, as the genome
    docstring suggests) gives the child the same genome detached gives: plain tensors, no autograd graph
    (the ΔW crossovers used to fail on their ``out=`` products)."""
    parents = [lora_genome(1), lora_genome(2)]
    live = [{k: t.clone().requires_grad_(True) for k, t in p.items()} for p in parents]
    if name in operators.MUTATIONS:
        expected, child = mutate(name, parents[0]), mutate(name, live[0])
    else:
        expected, child = cross(name, parents), cross(name, live)
    for key, tensor in expected.items():
        assert not child[key].requires_grad and child[key].grad_fn is None, key
        assert torch.equal(child[key], tensor), key


def test_parents_on_different_devices_are_refused_naming_the_key():
    parents = [lora_genome(1), {k: t.to("meta") for k, t in lora_genome(2).items()}]
    first = next(iter(parents[0]))
    with pytest.raises(ValueError, match=rf"key '{first}': device cpu in parent 0, meta in parent 1"):
        check_parents(parents)
    for name in PAIRED:
        with pytest.raises(ValueError, match="device"):
            cross(name, parents)


def test_a_bare_layers_weight_and_bias_are_one_module():
    """The top-level ``weight`` and ``bias`` of a bare ``nn.Linear`` travel together (they were two
    modules, so ``uniform`` mixed one parent's weight with the other's bias)."""
    layers = [nn.Linear(5, 3) for _ in range(2)]
    parents = [dict(layer.state_dict()) for layer in layers]
    assert genome.module_groups(parents[0], []) == [["weight", "bias"]]
    for seed in range(20):
        child = cross("uniform", parents, seed=seed)
        source = [i for i, p in enumerate(parents) if torch.equal(child["weight"], p["weight"])]
        assert source and torch.equal(child["bias"], parents[source[0]]["bias"]), seed


BAD_FACTORS = {
    "integer": ({"m.lora_A.weight": torch.arange(10).reshape(2, 5), "m.lora_B.weight": torch.arange(8).reshape(4, 2)},
                TypeError, "LoRA factors of 'm' must be floating-point tensors"),
    "rank 0": ({"m.lora_A.weight": torch.zeros(0, 5), "m.lora_B.weight": torch.zeros(4, 0)},
               ValueError, r"LoRA factors of 'm' have rank 0"),
    "a list": ({"w": [1.0, 2.0]}, TypeError, r"must map names to torch tensors: 'w' holds a list"),
    "no inputs": ({"m.lora_A.weight": torch.zeros(4, 0), "m.lora_B.weight": torch.ones(6, 4)},
                  ValueError, r"LoRA factors of 'm' adapt a layer with no inputs \(A \(4, 0\), B \(6, 4\)\)"),
    "no outputs": ({"m.lora_A.weight": torch.ones(4, 8), "m.lora_B.weight": torch.zeros(0, 4)},
                   ValueError, r"LoRA factors of 'm' adapt a layer with no outputs"),
}  # fmt: skip


@pytest.mark.parametrize("bad", sorted(BAD_FACTORS))
def test_factors_no_operator_can_use_are_refused_naming_the_key(bad):
    """Integer LoRA factors gave children truncated back to integers (one rank component lost), rank-0 factors
    a ZeroDivisionError, IndexError or RuntimeError by operator, a list an AttributeError naming no key (a
    robustness review), zero-width factors a ZeroDivisionError or a reshape error (a review): every operator
    refuses them with the key named."""
    genome_, error, message = BAD_FACTORS[bad]
    for name in operators.MUTATIONS:
        with pytest.raises(error, match=message):
            mutate(name, genome_, strength=0.1)
    for name in PAIRED:
        with pytest.raises(error, match=message):
            cross(name, [genome_, genome_])
