"""LoRA LLM members in ``evolve``'s PBT loop (``agents.members``) and the ``populora train`` command."""

from __future__ import annotations

import fcntl
import gc
import json
import os
import random
import re
import signal
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import agents.grpo
from agents.grpo import UpdateStats
from agents.members import (
    GRPOMemberLearner,
    LoRAMember,
    grpo_inputs,
    shared_population,
)
from agents.policy import answer_prefill
from evolve import pbt
from evolve.checkpoint import load_latest
from evolve.learners import LEARNERS, LearnerConfig
from evolve.members import POLICIES
from evolve.pbt import PBTConfig, run_pbt
from evolve.protocols import Transition, is_evolvable
from evolve.runlog import truncated_share
from populora_env import teacher_student_v0
from populora_env.cli import main
from populora_env.game import TeacherStudentConfig
from tests.agents_fixtures import one_torch_thread, tiny_base_dir
from tests.test_checkpoint_resume import record_generations

__all__ = ["one_torch_thread", "tiny_base_dir"]  # fixtures are used by name
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def lora_options(base: Path, **grpo: Any) -> dict[str, Any]:
    lora = {"base": str(base), "rank": 4, "max_new_tokens": 8, "dtype": "float32", "device": "cpu"}
    return {"lora": lora, "grpo": {"learning_rate": 0.05, **grpo}}


def text_env(**fields: Any) -> TeacherStudentConfig:
    defaults = dict(mode="text", n_teachers=1, n_students=1, rounds=1, task_types=("deduction",),
                    teacher_group_size=2, student_group_size=2)  # fmt: skip
    return TeacherStudentConfig(**{**defaults, **fields})


def lora_config(run_dir: Path, base: Path, **fields: Any) -> PBTConfig:
    defaults = dict(seed=0, generations=2, episodes_per_generation=2, env=text_env(), teachers="lora",
                    students="lora", population=2, learner="grpo", replace_fraction=0.5,
                    member_options=lora_options(base), progress=False, tensorboard=False)  # fmt: skip
    return PBTConfig(run_dir=str(run_dir), **{**defaults, **fields})


def base_weights(options: dict[str, Any]) -> dict[str, torch.Tensor]:
    model = shared_population(options).model
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ----- the PBT loop with LoRA members --------------------------------------------------------------------
def test_lora_members_evolve_and_learn_on_a_frozen_base(tmp_path: Path, tiny_base_dir: Path) -> None:
    config = lora_config(tmp_path / "run", tiny_base_dir)
    before = base_weights(config.member_options)
    run_dir = run_pbt(config)
    history = records(run_dir / "metrics.jsonl")
    assert [h["generation"] for h in history] == [0, 1]
    # generation 0: every teacher learned (a GRPO update on its proposals; the tiny test base writes no
    # valid task, so students had nothing to solve), the worst teacher was replaced by a mutated clone;
    # the students, never evaluated, were not judged (neither replaced nor parents)
    assert sorted(history[0]["losses"]) == ["0", "1"]
    assert all(loss is not None for loss in history[0]["losses"].values())
    # the GRPO update's figures, per member (the truncation count over exactly the completions it trained on),
    # counted by role too: these teachers trained on teachers' answers only
    info = history[0]["learner_info"]
    figures = {"completions", "truncated", "tokens", "clip_fraction", "grad_norm", "skipped"}
    assert sorted(info) == ["0", "1"] and all(
        set(i) == figures | {"completions_teacher", "truncated_teacher"}
        and i["completions"] == i["completions_teacher"] >= 1
        and 0 <= i["truncated"] == i["truncated_teacher"] <= i["completions"]
        and i["skipped"] == 0.0
        for i in info.values()
    )
    children = [r for r in records(run_dir / "lineage.jsonl") if r["origin"] == "offspring"]
    assert {c["role"] for c in children} == {"teacher"} and all(c["parents"] for c in children)
    assert all(history[0]["fitness"][str(m)] is None for m in (2, 3))  # the two students
    assert history[0]["operator_use"] and history[1]["operator_use"] == {}
    # 2 proposals per episode, each with its own transition and reward
    assert history[0]["mean_reward"]["teacher"] <= -0.5
    after = base_weights(config.member_options)
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    final = load_latest(run_dir / "checkpoints")
    assert final is not None
    genome = final["groups"]["teacher"][0]["genome"]
    assert genome and all(k.endswith(("lora_A.weight", "lora_B.weight")) for k in genome)


class CannedStudent(LoRAMember):
    """A real LoRA member whose answers are drawn from canned texts by its own seeded generator.

    The tiny test base cannot write a well-formed answer, so its rewards would never vary within a GRPO
    group; the genome, the GRPO learner and the checkpoints are the real ones.
    """

    TEXTS = ("0\n```\n</answer>", "1\n```\n</answer>", "")  # wrong/right, wrong/right, malformed

    def __init__(self, env: Any, role: str, seed: int, member_options: dict[str, Any]) -> None:
        super().__init__(env, role, seed, member_options)
        self.rng = random.Random(seed)

    def reseed(self, seed: int) -> None:
        super().reseed(seed)
        self.rng = random.Random(seed)

    def act(self, observation: Any, agent: str) -> str:
        return answer_prefill(observation) + self.rng.choice(self.TEXTS)

    def act_batch(self, observations: Sequence[Any], agents: Sequence[str]) -> list[str]:
        return [self.act(o, a) for o, a in zip(observations, agents, strict=True)]


POLICIES["lora_canned"] = lambda env, role, seed, config: CannedStudent(
    env, role, seed, config.member_options
)


class Crash(Exception):
    """Stands in for a kill right after a checkpoint landed."""


def first_difference(a: Any, b: Any, path: str = "checkpoint") -> str | None:
    """Where two nested checkpoints first differ (bit-exact on tensors), or ``None`` if they are equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: {type(a).__name__} vs {type(b).__name__}"
        if (a.dtype, a.shape, a.device) != (b.dtype, b.shape, b.device):
            return f"{path}: {a.dtype} {tuple(a.shape)} {a.device} vs {b.dtype} {tuple(b.shape)} {b.device}"
        if not torch.equal(a, b):
            gap = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "n/a"
            return f"{path}: values differ (max |a - b| = {gap})"
        return None
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(map(str, a))[:5]} vs {sorted(map(str, b))[:5]}"
        return next((d for k in a if (d := first_difference(a[k], b[k], f"{path}[{k!r}]"))), None)
    if isinstance(a, list | tuple):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        return next(
            (d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{path}[{i}]"))), None
        )
    return None if a == b else f"{path}: {a!r:.120} vs {b!r:.120}"


def crash_after_first_checkpoint_then_resume(config: PBTConfig, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs ``config`` until checkpoint 1 has landed, stops it there (an exception standing in for a kill),
    checks that the stopped generation wrote no log line, then reruns it to the end; returns the run dir."""
    real_save = pbt.save_checkpoint

    def save_then_crash(directory: Path, generation: int, state: dict[str, Any], keep: int) -> Path:
        path = real_save(directory, generation, state, keep)
        if generation == 1:
            raise Crash
        return path

    monkeypatch.setattr(pbt, "save_checkpoint", save_then_crash)
    with pytest.raises(Crash):
        run_pbt(config)
    monkeypatch.undo()
    assert records(Path(config.run_dir) / "metrics.jsonl") == []  # killed before its log line
    ran = record_generations(monkeypatch)
    run_dir = run_pbt(config)
    monkeypatch.undo()
    assert ran == list(range(1, config.generations))  # resumed from checkpoint 1, not from the start
    return run_dir


def assert_same_run(reference: Path, other: Path, generation: int, files: tuple[str, ...]) -> dict[str, Any]:
    """Two run directories hold the same log ``files`` byte for byte and the same last checkpoint (at
    ``generation``), bit for bit; returns that checkpoint."""
    for name in files:
        assert (reference / name).read_bytes() == (other / name).read_bytes(), name
    a, b = load_latest(reference / "checkpoints"), load_latest(other / "checkpoints")
    assert a is not None and b is not None and a["generation"] == b["generation"] == generation
    assert (difference := first_difference(a, b)) is None, difference
    return a


def test_lora_run_resumes_bit_identical_after_an_interruption(
    tmp_path: Path, tiny_base_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = dict(teachers="scripted", students="lora_canned", generations=3, scripted_strength=0.0)
    reference = run_pbt(lora_config(tmp_path / "reference", tiny_base_dir, **fields))
    config = lora_config(tmp_path / "resumed", tiny_base_dir, **fields)
    resumed = crash_after_first_checkpoint_then_resume(config, monkeypatch)
    a = assert_same_run(reference, resumed, 3, ("metrics.jsonl", "lineage.jsonl", "config.json"))
    # GRPO really moved the students (lora_B starts at zero; mutations scale with a tensor's spread, so
    # only gradient steps make it non-zero), and their AdamW state went through the checkpoint
    students = a["groups"]["student"]
    assert all(any(v.abs().sum() > 0 for k, v in m["genome"].items() if ".lora_B." in k) for m in students)
    assert all(m["learner"]["state"] for m in students)
    history = records(reference / "metrics.jsonl")
    assert all(h["losses"] and all(v is not None for v in h["losses"].values()) for h in history)


# ----- the learner's inputs and state ----------------------------------------------------------------------
@pytest.mark.slow
def test_lora_members_on_ray_equal_local(tmp_path: Path, tiny_base_dir: Path) -> None:
    """Ray actors build LoRA members (each actor loads the base itself) and run GRPO with the learner state
    the coordinator sends: the run equals the local one, bit for bit."""
    pytest.importorskip("ray")
    local = run_pbt(lora_config(tmp_path / "local", tiny_base_dir))
    on_ray = run_pbt(lora_config(tmp_path / "ray", tiny_base_dir, backend="ray", ray_num_cpus=2))
    assert_same_run(local, on_ray, 2, ("metrics.jsonl", "lineage.jsonl", "config.json"))
    assert any(h["lineage"] for h in records(local / "metrics.jsonl"))  # children were made and played


def test_grpo_learner_maps_transitions_and_keeps_per_adapter_state(
    tiny_base_dir: Path, verifier: Any
) -> None:
    options = lora_options(tiny_base_dir)
    env = teacher_student_v0.env(config=text_env(), verifier=verifier)
    member = LoRAMember(env, "student", 1, options)
    other = LoRAMember(env, "student", 2, options)
    assert is_evolvable(member) and member.adapter != other.adapter
    learner = LEARNERS["grpo"](member, LearnerConfig())
    obs: list[dict[str, Any]] = [
        {"prompt": f"## Solve a deduction task {i}", "phase": 2, "task_type": 0, "attempt": 0} for i in (0, 1)
    ]
    prefix = answer_prefill(obs[0])
    texts = ["3\n```\n</answer>", "x", "4\n```\n</answer>", "5"]
    experience = [
        Transition("student_0", "student", obs[i // 2], prefix + text, reward, 0)
        for i, (text, reward) in enumerate(zip(texts, [1.0, -1.0, -0.5, -0.5], strict=True))
    ]
    inputs = grpo_inputs(experience, prefill=True)
    assert inputs["prompts"] == [o["prompt"] + prefix for o in obs for _ in range(2)]
    assert inputs["completions"] == texts
    assert (
        inputs["group_ids"][0] == inputs["group_ids"][1] != inputs["group_ids"][2] == inputs["group_ids"][3]
    )
    assert set(inputs["task_keys"]) == {("student", "deduction")}
    mine, theirs = member.get_genome(), other.get_genome()
    base = base_weights(options)
    stats = learner.update(member, experience)
    assert stats.samples == 4 and stats.loss == stats.loss  # finite, not skipped
    assert any(not torch.equal(v, mine[k]) for k, v in member.get_genome().items())
    assert all(torch.equal(v, theirs[k]) for k, v in other.get_genome().items())
    assert all(torch.equal(v, base[n]) for n, v in base_weights(options).items())
    state = learner.state_dict()
    assert state["state"] and all(int(s["step"]) == 1 for s in state["state"].values())
    learner.reset()
    assert learner.state_dict()["state"] == {}
    learner.load_state_dict(state)
    assert (difference := first_difference(learner.state_dict(), state)) is None, difference
    with pytest.raises(ValueError, match="prefilled answer scaffold"):
        learner.update(member, [Transition("student_0", "student", obs[0], "no prefix", 1.0, 0)])
    with pytest.raises(ValueError, match="member_options\\['grpo'\\]"):
        GRPOMemberLearner(member, LearnerConfig(lr=0.5))
    # a member's adapter leaves the shared population once the member is gone (at the next creation)
    names = {member.adapter, other.adapter}
    del member, other, learner, stats
    gc.collect()
    newcomer = LoRAMember(env, "teacher", 3, options)
    assert not names & set(shared_population(options).adapter_names)
    assert newcomer.adapter in shared_population(options).adapter_names


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"lora": {"rank": 0}}, "rank"),
        ({"lora": {"rnak": 4}}, "rnak"),
        ({"lora": {"temperature": 0.0}}, "temperature"),
        ({"lora": {"temperature": 1e-40}}, "temperature'\\] must be a finite number >= 1e-06"),
        ({"lora": {"dtype": "float64"}}, "dtype"),
        ({"grpo": {"learning_rate": -1.0}}, "learning_rate"),
        ({"grpo": {"max_new_tokens": 4}}, "max_new_tokens"),
        ({"lora": "rank 4"}, "member_options\\['lora'\\]"),
    ],
)
def test_a_bad_member_option_raises_value_error_naming_it(
    tmp_path: Path, tiny_base_dir: Path, options: dict[str, Any], named: str
) -> None:
    config = lora_config(tmp_path, tiny_base_dir, member_options=options)
    with pytest.raises(ValueError, match=named) as raised:
        POLICIES["lora"](teacher_student_v0.raw_env(config=config.env), "teacher", 0, config)
    assert not re.search(r"(member_options\['\w+'\]): \1", str(raised.value))  # the prefix once


def test_lora_members_need_text_mode_and_the_grpo_learner(tmp_path: Path, tiny_base_dir: Path) -> None:
    config = lora_config(tmp_path / "run", tiny_base_dir, learner="reinforce")
    with pytest.raises(ValueError, match="learner='grpo'"):
        run_pbt(config)
    structured = TeacherStudentConfig(mode="structured", n_teachers=1, n_students=1)
    config = lora_config(tmp_path / "run2", tiny_base_dir)
    with pytest.raises(ValueError, match="text mode"):
        POLICIES["lora"](teacher_student_v0.raw_env(config=structured), "teacher", 0, config)


# ----- populora train --------------------------------------------------------------------------------------
def test_populora_train_runs_resumes_and_prints_the_summary(
    tmp_path: Path, tiny_base_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "--preset", "self-play", "--base", str(tiny_base_dir), "--run-dir", str(run_dir),
            "--generations", "2", "--max-new-tokens", "4", "--rank", "2", "--no-tensorboard"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    table = [line.split() for line in out.splitlines() if line[:3].strip().isdigit()]
    assert [row[0] for row in table] == ["0", "1"]
    # what the command does with the folder, and a line a generation above the bar
    assert f"run: starting {run_dir}: 2 generations" in err
    assert "generation 0: solve rate " in err and "generation 1: solve rate " in err
    assert f"checkpoints  {run_dir / 'checkpoints'}" in out
    config = json.loads((run_dir / "config.json").read_text())
    assert config["self_play"] and config["teachers"] == config["students"] == "lora"
    assert config["member_options"]["lora"]["base"] == str(tiny_base_dir)
    # (the README: GRPO's learning rate is under member_options.grpo; learner_config is REINFORCE's default)
    assert "learning_rate" in config["member_options"]["grpo"] and config["learner_config"] == {
        "lr": 0.01,
        "steps": 2,
    }
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    # four new tokens make no program: every proposal is turned away, and the summary says why
    rejected = sum(sum(json.loads(line)["rejections"].values()) for line in metrics.splitlines())
    assert rejected > 0 and f"why proposals were rejected ({rejected} in all): format_error/" in out
    # and how many of the answers the learner trained on were cut off at the 4-token budget, by role: the
    # self-play members' batches held teachers' answers only (no task was valid, no student answered)
    infos = [json.loads(line)["learner_info"] for line in metrics.splitlines()]
    cut = [truncated_share(info, "teacher") for info in infos]
    assert all(c is not None and 0 < c <= 1 for c in cut) and cut == [truncated_share(info) for info in infos]
    assert all(truncated_share(info, "student") is None for info in infos)
    assert [row[5:7] for row in table] == [[f"{c:.2f}", "-"] for c in cut]
    assert f", cut off: teacher {cut[0]:.2f}\n" in err
    assert main(argv) == 0  # the same command again: resumed from the last checkpoint, nothing to redo
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines() if line[:3].strip().isdigit()] == ["0", "1"]
    assert f"run: {run_dir}: all 2 generations done; nothing to run" in err
    assert main([*argv[:-3], "--rank", "4", "--no-tensorboard"]) == 2  # another config in that folder
    assert "another config (fields ['member_options'] differ: --rank (member_options.lora.rank): saved 2, " \
           "now 4); rerun with the options it was made with (its config.json), or give another --run-dir" \
           in capsys.readouterr().err  # fmt: skip
    # the run is saved before its figure is drawn: a figure that cannot be written is said, not a failure
    (run_dir / "curves.png").unlink()
    (run_dir / "curves.png").mkdir()
    assert main(argv) == 0
    assert "curves       not drawn (" in capsys.readouterr().out


def test_populora_train_refuses_bad_options_before_building_the_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad options and an unusable --run-dir are exit status 2 with a one-line message naming the
    problem, given before the tiny base is built (minutes on a fresh machine), never a traceback."""
    import agents.base

    def no_build(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the tiny base was built before the options were checked")

    monkeypatch.setattr(agents.base, "build_tiny_base", no_build)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for extra, message in (
        (["--population", "0"], "--population must be an int >= 1, got 0"),
        (["--threads", "0"], "--threads must be an int from 1 to "),
        (["--threads", "100000"], f"threads must be an int from 1 to {os.cpu_count()} (this machine's CPUs)"),
        (["--rank", "0"], "--rank (member_options['lora']['rank']) must be an int >= 1, got 0"),
        (["--episodes", "1"], "--episodes (episodes_per_generation) * seats (1 * 1) must be >= population"),
        (["--learning-rate", "-1"], "--learning-rate must be"),
        (["--learning-rate", "nan"], "--learning-rate must be a finite number > 0, got nan"),
        (["--group-size", "0"], "--group-size must be an int >= 2"),
        (["--generations", "0"], "populora train: --generations must be an int >= 1, got 0"),
        (["--group-size", "1"], "a group of one has none, and nothing learns), got 1"),
        (["--run-dir", str(a_file / "run")], str(a_file / "run")),
        (["--run-dir", str(a_file)], f"--run-dir {a_file} is a file, not a folder"),
        # (tyro made "" the path ".": the run was written into the working folder; an audit)
        (["--run-dir", ""], "--run-dir must not be empty, got ''"),
        (["--cache-dir", " "], "--cache-dir must not be empty, got ' '"),
        (["--base", ""], "--base must not be empty, got ''"),
    ):
        argv = ["train", "--run-dir", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), *extra]
        assert main(argv) == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (extra, err)
        assert not (tmp_path / "cache").exists() and not any((tmp_path / "cwd").iterdir())
    # a run folder another run holds: refused before the base is built (minutes), not after (an audit)
    held = tmp_path / "held"
    held.mkdir()
    fd = os.open(held / pbt.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"4242\n")
        assert main(["train", "--run-dir", str(held), "--cache-dir", str(tmp_path / "cache")]) == 2
        assert f"{held} is in use by another run (pid 4242)" in capsys.readouterr().err
    finally:
        os.close(fd)
    # a base that cannot load: no "the same command starts the run again" (it would fail the same way)
    assert not (tmp_path / "run-nobase").exists()
    argv = ["train", "--run-dir", str(tmp_path / "run-nobase"), "--base", str(tmp_path / "no-base")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no such model folder" in err and "the same command" not in err, err
    assert not (tmp_path / "run-nobase").exists()  # found before any folder is made
    (tmp_path / "a-file").write_text("{}")  # (read "no such model folder" of a file that is there; an audit)
    assert main(["train", "--run-dir", str(tmp_path / "run-nobase"), "--base", str(tmp_path / "a-file")]) == 2
    assert f"--base {tmp_path / 'a-file'} is a file, not a model folder" in capsys.readouterr().err
    # a folder that is no model: found as the run starts, and the folder made for it is removed, lock file
    # and all (it was left holding the lock file alone)
    # (and so are the folders above it that it made: an empty runs/ was left; an audit)
    (tmp_path / "not-a-model").mkdir()
    deep = tmp_path / "runs" / "deeper" / "run-nobase"
    argv = ["train", "--run-dir", str(deep), "--base", str(tmp_path / "not-a-model")]
    assert main(argv) == 2
    assert "the folder holds no config.json, so it is no Hugging Face model folder" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_populora_train_stopped_while_the_base_is_built_leaves_no_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM before the run began (the base's pretraining takes minutes) left the empty --run-dir the
    command had made (a review)."""
    import agents.base

    def killed_in_the_build(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the build")

    monkeypatch.setattr(agents.base, "build_tiny_base", killed_in_the_build)
    argv = ["train", "--run-dir", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM; no checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    (tmp_path / "kept").mkdir()  # a folder the command did not make stays
    assert main([*argv[:1], "--run-dir", str(tmp_path / "kept"), *argv[3:]]) == 128 + signal.SIGTERM
    assert (tmp_path / "kept").is_dir()


def test_populora_train_resumes_when_the_cached_base_is_reached_by_another_path(
    tmp_path: Path, tiny_base_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run records its base by path: the same cached base reached through a link (a linked ~/.cache, a
    relative --cache-dir) read as another config and the run would not resume."""
    import agents.base

    link = tmp_path / "linked-cache"
    link.symlink_to(tiny_base_dir)
    paths = iter([link, tiny_base_dir])
    monkeypatch.setattr(agents.base, "build_tiny_base", lambda *args, **kwargs: next(paths))
    run_dir = tmp_path / "run"
    argv = ["train", "--preset", "self-play", "--run-dir", str(run_dir), "--generations", "1",
            "--max-new-tokens", "4", "--rank", "2", "--no-tensorboard"]  # fmt: skip
    assert main(argv) == 0
    assert main([*argv[:6], "2", *argv[7:]]) == 0, capsys.readouterr().err  # extended, by the real path
    config = json.loads((run_dir / "config.json").read_text())
    assert config["member_options"]["lora"]["base"] == str(link) and config["generations"] == 2
    # a relative --cache-dir: the run records the absolute path, and resumes from another folder
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    paths = iter([Path(os.path.relpath(tiny_base_dir)), tiny_base_dir])
    second = ["train", "--preset", "self-play", "--run-dir", str(tmp_path / "run2"), "--generations", "1",
              *argv[7:]]  # fmt: skip
    assert main(second) == 0
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main([*second[:6], "2", *second[7:]]) == 0, capsys.readouterr().err
    saved = json.loads((tmp_path / "run2" / "config.json").read_text())["member_options"]["lora"]["base"]
    assert Path(saved).is_absolute() and os.path.samefile(saved, tiny_base_dir)


def test_populora_train_records_a_relative_base_by_its_absolute_path(
    tmp_path: Path, tiny_base_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A relative --base was recorded as typed: the same command from another folder, where that name is
    another model, resumed the run on it as if nothing had changed."""
    for folder in ("here", "elsewhere"):
        (tmp_path / folder).mkdir()
    (tmp_path / "here" / "base").symlink_to(tiny_base_dir)
    (tmp_path / "elsewhere" / "base").mkdir()  # another folder of the same relative name
    run_dir = tmp_path / "run"
    argv = ["train", "--preset", "self-play", "--base", "base", "--run-dir", str(run_dir), "--generations",
            "1", "--max-new-tokens", "4", "--rank", "2", "--no-tensorboard"]  # fmt: skip
    monkeypatch.chdir(tmp_path / "here")
    assert main(argv) == 0
    saved = json.loads((run_dir / "config.json").read_text())["member_options"]["lora"]["base"]
    assert saved == str(tmp_path / "here" / "base")
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(argv) == 2
    assert (
        f'--base (member_options.lora.base): saved "{tmp_path / "here" / "base"}", now'
        in capsys.readouterr().err
    )
    # the same model by another relative path resumes the run: it is the config it recorded
    monkeypatch.chdir(tmp_path)
    assert main([*argv[:4], "here/base", *argv[5:8], "2", *argv[9:]]) == 0, capsys.readouterr().err
    assert len(records(run_dir / "metrics.jsonl")) == 2


def test_populora_train_reports_an_error_inside_the_run_in_one_line(
    tmp_path: Path, tiny_base_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error other than a bad option inside the run (out of memory, a CUDA error) was a raw traceback:
    it is one line naming the error, where it was raised and the checkpoint to resume from; the traceback
    is kept in the run folder. A --rank no linear layer of the base can hold is refused."""
    real = pbt.run_generation

    def out_of_memory_in_the_second(population: Any, backend: Any, config: Any, generation: int) -> Any:
        if generation == 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore detail")
        return real(population, backend, config, generation)

    monkeypatch.setattr(pbt, "run_generation", out_of_memory_in_the_second)
    run_dir = tmp_path / "run"
    argv = ["train", "--preset", "self-play", "--base", str(tiny_base_dir), "--run-dir", str(run_dir),
            "--generations", "2", "--max-new-tokens", "4", "--rank", "2", "--no-tensorboard"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert (
        f"populora train: RuntimeError: CUDA out of memory. Tried to allocate 20.00 GiB (at {__file__}:"
        in err
    )
    assert f"traceback in {run_dir / 'error.log'}); once mended, the same command resumes it from " \
           f"{run_dir / 'checkpoints' / 'gen_000001.ckpt'}" in err  # fmt: skip
    assert "out_of_memory_in_the_second" in (run_dir / "error.log").read_text()
    monkeypatch.setattr(pbt, "run_generation", real)
    assert main(argv) == 0  # resumed
    assert len(records(run_dir / "metrics.jsonl")) == 2
    assert main([*argv[:-3], "--rank", "100000", "--no-tensorboard", "--run-dir", str(tmp_path / "big")]) == 2
    assert "populora train: --rank must be <= " in capsys.readouterr().err  # (named as the option: an audit)


def test_populora_train_says_when_learners_raised_and_fails_when_all_did(
    tmp_path: Path, tiny_base_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every update raised and was undone (a learning rate of 1e300 did, before GRPOConfig refused it), and the
    run ended with status 0 and a table like any other. The summary counts the failures; none trained:
    status 1."""
    run_dir = tmp_path / "run"
    argv = ["train", "--preset", "self-play", "--base", str(tiny_base_dir), "--run-dir", str(run_dir),
            "--generations", "2", "--max-new-tokens", "4", "--rank", "2", "--no-tensorboard"]  # fmt: skip
    assert main([*argv, "--learning-rate", "1e300"]) == 2
    assert (
        "--learning-rate (GRPOConfig.learning_rate) must be within float32's range" in capsys.readouterr().err
    )

    def exploding(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("learner exploded")

    monkeypatch.setattr(agents.grpo.GRPOLearner, "update", exploding)
    assert main(argv) == 1
    out, err = capsys.readouterr()
    failures = [f for r in records(run_dir / "metrics.jsonl") for f in r["learner_failures"]]
    assert failures, "no learner raised: the test does not test"
    assert f"learner failures: {len(failures)} of {len(failures)} updates raised and were undone (first: " \
           "generation 0, member 0: " in out  # fmt: skip
    assert f"every learner update raised ({len(failures)} of {len(failures)}): nothing was trained" in err


def test_lora_options_take_numpy_numbers_as_python_ones() -> None:
    import numpy as np

    from agents.members import LoRAMemberOptions

    options = LoRAMemberOptions(rank=np.int64(4), max_new_tokens=np.int32(8), alpha=np.float32(8), top_p=0.5)
    assert (type(options.rank), type(options.max_new_tokens), type(options.alpha)) == (int, int, float)
    assert (options.rank, options.alpha, options.top_p) == (4, 8.0, 0.5)
    with pytest.raises(ValueError, match="'rank'] must be an int >= 1"):
        LoRAMemberOptions(rank=np.bool_(True))


def test_populora_train_deterministic_option_reaches_the_grpo_config(tmp_path: Path) -> None:
    from agents.members import LoRAMemberOptions, grpo_config
    from populora_env.cli import TrainArgs, _train_config

    def learner_config(args: TrainArgs) -> Any:
        options = _train_config(args, "base").member_options
        return options, grpo_config(options, LoRAMemberOptions.from_member_options(options))

    options, config = learner_config(TrainArgs(run_dir=str(tmp_path)))
    # (no "deterministic" key by default: runs made before the option still resume)
    assert options["grpo"] == {"learning_rate": 3e-3}
    assert config.deterministic
    assert learner_config(TrainArgs(run_dir=str(tmp_path), deterministic=False))[1].deterministic is False


def test_grpo_learner_trains_on_the_sampled_token_ids(
    tiny_base_dir: Path, verifier: Any, monkeypatch: Any
) -> None:
    """The member keeps the ids it sampled and the learner passes them on, instead of re-tokenising text."""
    options = lora_options(tiny_base_dir)
    env = teacher_student_v0.env(config=text_env(), verifier=verifier)
    member = LoRAMember(env, "student", 3, options)
    learner = LEARNERS["grpo"](member, LearnerConfig())
    obs: list[dict[str, Any]] = [
        {"prompt": f"## Solve a deduction task {i}", "phase": 2, "task_type": 0, "attempt": 0}
        for i in (0, 0, 1)
    ]
    member.reseed(11)
    actions = member.act_batch(obs, ["student_0"] * len(obs))
    experience = [
        Transition("student_0", "student", o, a, r, 0) for o, a, r in zip(obs, actions, [1.0, -1.0, 0.0])
    ]
    inputs = grpo_inputs(experience, prefill=True)
    expected = member.population.generate_tokens(
        inputs["prompts"],
        [member.adapter] * len(obs),
        member.options.max_new_tokens,
        member.options.temperature,
        11,
    )  # the same call the policy made: its first after reseed(11) samples with seed 11
    seen: dict[str, Any] = {}
    monkeypatch.setattr(learner.grpo, "update", lambda adapter, **kwargs: seen.update(kwargs) or _stats())
    learner.update(member, experience)
    assert seen["completion_ids"] == expected and seen["completions"] == inputs["completions"]
    member.reseed(12)  # a new generation forgets the ids: transitions it did not sample fall back to text
    learner.update(member, experience)
    assert seen["completion_ids"] is None


def test_a_learner_elsewhere_trains_on_the_ids_the_transitions_carry(tiny_base_dir: Path) -> None:
    """The Ray path: a member plays (as the episode actor's copy does) and a fresh member built on another
    seed (as a learner actor builds it) gets the genome, the learner state and the transitions. With the
    sampled ids in the transitions (``sample_record``) its update equals the playing member's own, bit for
    bit, with rewards that vary within each group (a non-zero update); the fresh member used to fall back
    to re-tokenised text, which trained other tokens."""
    options = {**lora_options(tiny_base_dir), "grpo": {"learning_rate": 0.05}}
    env = SimpleNamespace(config=SimpleNamespace(mode="text"))
    player, learner_actor = LoRAMember(env, "student", 1, options), LoRAMember(env, "student", 0, options)
    obs = [
        {"prompt": f"## Solve a deduction task {i}\nf = lambda x: x * {i}\nf({i + 1})", "phase": 2,
         "task_type": 0, "attempt": 0}
        for i in (0, 0, 0, 0, 1, 1, 1, 1)
    ]  # fmt: skip
    player.reseed(5)
    actions = player.act_batch(obs, ["student_0"] * len(obs))
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    experience = [
        Transition("student_0", "student", o, a, r, 0, player.sample_record(o, a))
        for o, a, r in zip(obs, actions, rewards, strict=True)
    ]
    assert all(t.sample and all(isinstance(i, int) for i in t.sample) for t in experience)
    assert player.sample_record(obs[0], "not sampled here") is None
    here, there = LEARNERS["grpo"](player, LearnerConfig()), LEARNERS["grpo"](learner_actor, LearnerConfig())
    learner_actor.set_genome(player.get_genome())
    there.reset()
    there.load_state_dict(here.state_dict())
    ours, theirs = here.update(player, experience), there.update(learner_actor, experience)
    assert ours.loss == theirs.loss and ours.loss != 0.0
    mine = player.get_genome()
    assert all(torch.equal(mine[k], v) for k, v in learner_actor.get_genome().items())


def _stats() -> UpdateStats:
    return UpdateStats("a", False, None, 0.0, None, 0.0, 0.0, 0.0, 3, 3, 1, ())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_populora_train_stopped_by_a_signal_says_so_in_one_line(
    tmp_path: Path, tiny_base_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    signum: int,
) -> None:  # fmt: skip
    """Ctrl-C or SIGTERM in the middle of a generation: one line naming the signal and the checkpoint the
    same command resumes from, exit status 128 + the signal, not a traceback; SIGTERM's handler is put back."""
    import evolve.pbt

    real = evolve.pbt.run_generation
    generations: list[int] = []

    def stopped_in_the_second(population: Any, backend: Any, config: Any, generation: int) -> Any:
        generations.append(generation)
        if generation == 1:
            os.kill(os.getpid(), signum)  # the real signal: SIGINT raises KeyboardInterrupt here
        return real(population, backend, config, generation)

    monkeypatch.setattr(evolve.pbt, "run_generation", stopped_in_the_second)
    run_dir = tmp_path / "run"
    argv = ["train", "--preset", "self-play", "--base", str(tiny_base_dir), "--run-dir", str(run_dir),
            "--generations", "3", "--max-new-tokens", "4", "--rank", "2", "--no-tensorboard"]  # fmt: skip
    before = signal.getsignal(signal.SIGTERM)
    # Ctrl-C as an interactive Python has it (a process started in the background, as under CI's nohup,
    # inherits SIGINT ignored)
    interrupt = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(argv) == 128 + signum
    finally:
        signal.signal(signal.SIGINT, interrupt)
    err = capsys.readouterr().err
    name = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
    assert (
        f"stopped by {name}; the same command resumes it from {run_dir / 'checkpoints' / 'gen_000001.ckpt'}"
        in err
    )
    assert "Traceback" not in err and generations == [0, 1]
    assert signal.getsignal(signal.SIGTERM) == before
    # on a line of its own: the progress bar is closed first (it was glued in front and drawn again after)
    assert f"\npopulora train: stopped by {name}" in err and not err.rstrip().endswith("it]")
    if signum == signal.SIGTERM:  # resumed: the command says from where
        monkeypatch.setattr(evolve.pbt, "run_generation", real)
        assert main(argv) == 0
        assert f"run: resuming {run_dir}: 1 of 3 generations done" in capsys.readouterr().err
