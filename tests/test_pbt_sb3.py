"""SB3 members in the PBT loop: MaskablePPO students and PPO teachers evolving and learning with SB3's PPO."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from evolve import pbt
from evolve.checkpoint import load_latest
from evolve.learners import LearnerConfig
from evolve.pbt import PBTConfig, run_pbt
from evolve.protocols import Transition, is_evolvable
from populora_env import teacher_student_v0
from populora_env.game import TeacherStudentConfig
from tests.test_checkpoint_resume import _assert_same_run, record_generations

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"sb3": {"net_arch": [32], "n_epochs": 2, "batch_size": 16}}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny MLPs: extra torch threads only contend on a shared CI box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _env(n: int = 2, **kwargs: Any) -> TeacherStudentConfig:
    fields = {"mode": "structured", "n_teachers": n, "n_students": n, "rounds": 1, "n_slots": 3, **kwargs}
    return TeacherStudentConfig(**fields)


def _config(run_dir: Path, **kwargs: Any) -> PBTConfig:
    fields: dict[str, Any] = {
        "seed": 2, "generations": 3, "episodes_per_generation": 2, "env": _env(2), "teachers": "scripted",
        "students": "sb3", "population": 4, "learner": "ppo", "learner_config": LearnerConfig(lr=1e-3),
        "member_options": SMALL, "progress": False, "tensorboard": False, **kwargs,
    }  # fmt: skip
    return PBTConfig(run_dir=str(run_dir), **fields)


def _history(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _student(seed: int = 0, **options: Any) -> Any:
    from evolve.sb3_members import SB3Options, SB3Policy

    env = teacher_student_v0.raw_env(config=_env(1))
    return SB3Policy(env, "student", seed, SB3Options(**{"net_arch": (16,), **options}))


def _student_observations(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Student observations from the env's space with every candidate legal (``space.sample`` is seeded)."""
    space = teacher_student_v0.raw_env(config=_env(1)).observation_space("student_0")
    space.seed(seed)
    observations = [space.sample() for _ in range(count)]
    for observation in observations:
        observation["action_mask"][:] = 1
    return observations


# ----- the member ------------------------------------------------------------------------------------
def test_sb3_member_samples_reproducibly_within_the_mask_without_global_rng() -> None:
    policy = _student(seed=0)
    assert is_evolvable(policy) and set(policy.models) == {"student"}
    type_name = type(policy.models["student"]).__name__
    assert type_name == "MaskablePPO"
    observations = _student_observations(40)
    for observation in observations:
        observation["action_mask"][:] = [1, 0, 1, 0]
    global_state = torch.get_rng_state()

    def actions(seed: int) -> list[int]:
        policy.reseed(seed)
        return [policy.act(o, "student_0") for o in observations]

    first = actions(7)
    assert first == actions(7) and first != actions(8)
    assert set(first) == {0, 2}  # masked candidates are never chosen; both legal ones are
    assert torch.equal(torch.get_rng_state(), global_state)
    with pytest.raises(ValueError, match="not 'teacher_0'"):
        policy.act(observations[0], "teacher_0")


def test_sb3_genomes_are_seeded_state_dicts_with_named_mismatches() -> None:
    a, b, again = _student(seed=0), _student(seed=1), _student(seed=0)
    genome = a.get_genome()
    assert "student.action_net.weight" in genome and all(t.is_floating_point() for t in genome.values())
    assert all(torch.equal(genome[k], v) for k, v in again.get_genome().items())
    assert not torch.equal(genome["student.action_net.weight"], b.get_genome()["student.action_net.weight"])
    b.set_genome(genome)
    assert all(torch.equal(genome[k], v) for k, v in b.get_genome().items())
    with pytest.raises(ValueError, match=r"keys differ: missing \['student.value_net.bias'\]"):
        b.set_genome({k: v for k, v in genome.items() if k != "student.value_net.bias"})
    with pytest.raises(ValueError, match=r"'student\.action_net\.bias': shape \(3,\), expected \(4,\)"):
        b.set_genome({**genome, "student.action_net.bias": torch.zeros(3)})


def test_ppo_update_raises_the_rewarded_action_and_resumes_bit_identically() -> None:
    """Candidate 1 is paid, the others penalised: PPO updates raise its probability; a learner
    rebuilt from the genome and ``state_dict`` makes the same next update, bit for bit."""
    from evolve.sb3_members import PPOLearner

    config = LearnerConfig(lr=3e-3)
    policy = _student(seed=3, n_epochs=4, batch_size=8)
    learner = PPOLearner(policy, config)
    observations = _student_observations(30)
    batch = [
        Transition("student_0", "student", o, a, 1.0 if a == 1 else -0.5, 0)
        for i, o in enumerate(observations)
        for a in (i % 4,)
    ]
    model = policy.models["student"]

    def prob_of_1() -> float:
        obs, _ = model.policy.obs_to_tensor(
            {k: np.stack([o[k] for o in observations]) for k in observations[0]}
        )
        with torch.no_grad():
            return float(model.policy.get_distribution(obs).distribution.probs[:, 1].mean())

    curve = [prob_of_1()]
    for _ in range(3):  # PPO's clip bounds each update's step: a few updates show the trend
        stats = learner.update(policy, batch)
        assert stats.samples == 30 and np.isfinite(stats.loss)
        curve.append(prob_of_1())
    assert all(b > a for a, b in itertools.pairwise(curve)) and curve[-1] > curve[0] + 0.03, curve

    genome, state = policy.get_genome(), learner.state_dict()
    twin = _student(seed=99, n_epochs=4, batch_size=8)
    twin.set_genome(genome)
    twin_learner = PPOLearner(twin, config)
    twin_learner.load_state_dict(state)
    learner.update(policy, batch)
    twin_learner.update(twin, batch)
    after, twin_after = policy.get_genome(), twin.get_genome()
    assert all(torch.equal(after[k], twin_after[k]) for k in after)
    assert not all(torch.equal(after[k], genome[k]) for k in after)


# ----- the loop --------------------------------------------------------------------------------------
def test_sb3_students_learn_by_ppo_and_evolve_by_operators(tmp_path: Path) -> None:
    from evolve.sb3_members import PPO_INFO

    config = _config(tmp_path / "run")
    history = _history(run_pbt(config))
    assert [h["generation"] for h in history] == [0, 1, 2]
    for h in history:  # every student member trained with a finite PPO loss; scripted teachers did not
        students = [k for k in h["fitness"] if int(k) >= 2]
        assert sorted(h["losses"]) == sorted(students) and all(v is not None for v in h["losses"].values())
        # SB3's own figures of each update (its logger's train/...), by role
        assert sorted(h["learner_info"]) == sorted(students) and all(
            set(i) == {f"student/{name}" for name in PPO_INFO} and 0 <= i["student/clip_fraction"] <= 1
            for i in h["learner_info"].values()
        )
    children = [r for h in history for r in h["lineage"]]
    assert children and all(r["role"] == "student" and r["crossover"] in config.crossovers for r in children)
    state = load_latest(tmp_path / "run" / "checkpoints")
    assert state is not None
    from evolve.sb3_members import SB3Policy

    initial = SB3Policy(
        teacher_student_v0.raw_env(config=config.env), "student", 0, _options(config)
    ).get_genome()  # same keys and shapes as every stored genome, so PPO and the operators kept them
    genomes = [m["genome"] for m in state["groups"]["student"]]
    assert all(g.keys() == initial.keys() for g in genomes)
    assert all(g[k].shape == initial[k].shape for g in genomes for k in g)
    assert all(set(m["learner"]["optimizers"]) == {"student"} for m in state["groups"]["student"])


def _options(config: PBTConfig) -> Any:
    from evolve.sb3_members import SB3Options

    return SB3Options.from_member_options(config.member_options)


def test_ppo_changes_the_genomes_of_the_generation(tmp_path: Path) -> None:
    """With no replacement, the only thing that changes a member between checkpoints is its learner."""
    first = load_latest(run_pbt(_config(tmp_path / "a", generations=1)) / "checkpoints")
    second = load_latest(run_pbt(_config(tmp_path / "b", generations=1, learner="none")) / "checkpoints")
    assert first is not None and second is not None
    for trained, untrained in zip(first["groups"]["student"], second["groups"]["student"], strict=True):
        assert trained["id"] == untrained["id"]  # same seeds: same initial members
        diffs = [not torch.equal(trained["genome"][k], untrained["genome"][k]) for k in trained["genome"]]
        assert any(diffs)


class _Crash(Exception):
    """Stands for a kill right after a checkpoint landed."""


def test_sb3_run_resumes_bit_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = run_pbt(_config(tmp_path / "reference", generations=4))
    real_save = pbt.save_checkpoint
    saved = []

    def save_then_crash(*args: Any, **kwargs: Any) -> Any:
        path = real_save(*args, **kwargs)
        saved.append(path)
        if len(saved) == 2:
            raise _Crash
        return path

    monkeypatch.setattr(pbt, "save_checkpoint", save_then_crash)
    with pytest.raises(_Crash):
        run_pbt(_config(tmp_path / "resumed", generations=4))
    monkeypatch.setattr(pbt, "save_checkpoint", real_save)
    assert len(_history(tmp_path / "resumed")) == 1  # generation 1 was checkpointed but not logged
    ran = record_generations(monkeypatch)
    run_pbt(_config(tmp_path / "resumed", generations=4))  # a fresh call: new members, state from disk
    assert ran == [2, 3]  # from the last checkpoint, not from the start
    _assert_same_run(reference, tmp_path / "resumed", generations=4)
    a, b = load_latest(reference / "checkpoints"), load_latest(tmp_path / "resumed" / "checkpoints")
    assert a is not None and b is not None
    for ma, mb in zip(a["groups"]["student"], b["groups"]["student"], strict=True):
        adam_a, adam_b = ma["learner"]["optimizers"]["student"], mb["learner"]["optimizers"]["student"]
        assert adam_a["state"].keys() == adam_b["state"].keys()
        for index, moments in adam_a["state"].items():
            assert all(torch.equal(v, adam_b["state"][index][k]) for k, v in moments.items())
        assert ma["learner"]["rng"] == mb["learner"]["rng"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"env": _env(2, rounds=2), "teachers": "sb3", "students": "sb3"},
        {"env": _env(1, rounds=2), "teachers": "sb3", "students": "sb3", "self_play": True, "population": 1},
    ],
    ids=["sb3_teachers_and_students", "sb3_self_play"],
)
def test_sb3_teachers_learn_too(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    config = _config(tmp_path / "run", generations=2, **kwargs)
    history = _history(run_pbt(config))
    assert [h["generation"] for h in history] == [0, 1]
    assert all(h["losses"] and all(v is not None for v in h["losses"].values()) for h in history)
    state = load_latest(tmp_path / "run" / "checkpoints")
    assert state is not None
    roles = {"teacher", "student"}
    for members in state["groups"].values():
        for member in members:
            assert {k.split(".")[0] for k in member["genome"]} <= roles
            assert set(member["learner"]["optimizers"]) <= roles
    if config.self_play:  # one member holds a PPO teacher and a MaskablePPO student
        (member,) = state["groups"]["both"]
        assert {k.split(".")[0] for k in member["genome"]} == roles
    # each role learned: from the same seeds, the one generation's genomes differ from a run without
    # learners (one generation: no child replaces anyone yet; a skipped teacher model passed before)
    trained = load_latest(run_pbt(_config(tmp_path / "one", generations=1, **kwargs)) / "checkpoints")
    untrained = load_latest(
        run_pbt(_config(tmp_path / "none", generations=1, learner="none", **kwargs)) / "checkpoints"
    )
    assert trained is not None and untrained is not None
    for group, members in trained["groups"].items():
        for mine, theirs in zip(members, untrained["groups"][group], strict=True):
            assert mine["id"] == theirs["id"]
            for role in {k.split(".")[0] for k in mine["genome"]}:
                keys = [k for k in mine["genome"] if k.startswith(f"{role}.")]
                assert any(not torch.equal(mine["genome"][k], theirs["genome"][k]) for k in keys), (
                    group,
                    role,
                )


def test_each_role_can_have_its_own_learner(tmp_path: Path) -> None:
    """Torch teachers with REINFORCE next to sb3 students with PPO in one run (``learners`` per role)."""
    config = _config(tmp_path / "run", generations=2, teachers="torch", learner="reinforce",
                     learners={"student": "ppo"})  # fmt: skip
    assert (config.learner_for("teacher"), config.learner_for("student")) == ("reinforce", "ppo")
    history = _history(run_pbt(config))
    state = load_latest(tmp_path / "run" / "checkpoints")
    assert state is not None
    assert all(set(h["losses"]) == set(h["fitness"]) for h in history)  # every member learned
    assert all(v is not None for h in history for v in h["losses"].values())
    assert all("optimizers" in m["learner"] for m in state["groups"]["student"])  # PPO's state
    assert all("optimizers" not in m["learner"] for m in state["groups"]["teacher"])  # REINFORCE's
    with pytest.raises(ValueError, match=r"learners: keys must be among \['teacher', 'student'\]"):
        _config(tmp_path / "bad", learners={"critic": "ppo"})
    with pytest.raises(KeyError, match="ppo"):  # the registry's message lists the learners
        _config(tmp_path / "bad", learners={"student": "nope"})


# ----- bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_epoch": 2}, r"unknown option\(s\) \['n_epoch'\]"),
        ({"batch_size": 1}, r"member_options\['sb3'\]: batch_size must be an int >= 2"),
        ({"clip_range": -0.1}, "clip_range"),
        ({"lr": 0.1}, r"\['lr'\]: the learning rate is learner_config\.lr"),
        ({"activation": "gelu"}, "activation"),
        ({"max_grad_norm": 0}, r"max_grad_norm must be a number > 0, got 0"),  # it switched learning off
        ({"device": "gpu"}, r"device: not a torch device, 'gpu'"),
        ({"device": "cuda"} if not torch.cuda.is_available() else {"device": "nope"}, r"device"),
    ],
)
def test_a_bad_member_option_raises_value_error_naming_it(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        run_pbt(_config(tmp_path / "run", member_options={"sb3": options}))


def test_sb3_device_auto_is_accepted() -> None:
    """SB3's own ``"auto"`` (CUDA when there is one) is no torch device name, but a valid option."""
    from evolve.sb3_members import SB3Options

    assert SB3Options(device="auto").device == "auto" and SB3Options(device="cpu").device == "cpu"


def test_ppo_learner_refuses_a_non_sb3_member(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="SB3Policy members"):
        run_pbt(_config(tmp_path / "run", students="torch"))


def test_config_names_resolve_without_importing_the_module() -> None:
    """``PBTConfig(students="sb3", learner="ppo")`` imports ``evolve.sb3_members`` by itself."""
    code = (
        "import sys\n"
        "from evolve.pbt import PBTConfig\n"
        "assert 'evolve.sb3_members' not in sys.modules\n"
        "PBTConfig(run_dir='unused', students='sb3', learner='ppo')\n"
        "assert 'evolve.sb3_members' in sys.modules\n"
        "from evolve.members import POLICIES\n"
        "try:\n"
        "    POLICIES['human']\n"
        "except KeyError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "registered: random, scripted, torch; optional: lora, sb3" in out.stdout


@pytest.mark.slow
def test_sb3_members_on_ray_equal_local(tmp_path: Path) -> None:
    """Ray actors build sb3 members through the lazy registry and run PPO with the learner state the
    coordinator sends: the run equals the local one, bit for bit."""
    pytest.importorskip("ray")
    local = run_pbt(_config(tmp_path / "local", generations=2))
    on_ray = run_pbt(_config(tmp_path / "ray", generations=2, backend="ray", ray_num_cpus=2))
    _assert_same_run(local, on_ray, generations=2)
