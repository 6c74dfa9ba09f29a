"""LoRA policies and the population rollout collector in TeacherStudent-v0, with the real verifier."""

from __future__ import annotations

import dataclasses
import random
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("transformers")

from agents.base import build_tiny_base  # noqa: E402
from agents.generation import texts_of  # noqa: E402
from agents.grpo import GRPOConfig, GRPOLearner  # noqa: E402
from agents.policy import LoRAPolicy, answer_prefill  # noqa: E402
from agents.population import LoRAPopulation  # noqa: E402
from agents.rollout import (  # noqa: E402
    EpisodeRollout,
    RolloutCollector,
    RolloutConfig,
    grpo_batches,
    update_adapters,
)
from populora_env import Policy, play, teacher_student_v0  # noqa: E402
from populora_env.policies import ScriptedTeacher  # noqa: E402
from populora_env.text_format import format_answer, format_proposal  # noqa: E402
from tests.agents_fixtures import TEST_BASE_CONFIG, one_torch_thread, tiny_base_dir  # noqa: E402

__all__ = ["one_torch_thread", "tiny_base_dir"]  # fixtures are used by name
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_env(verifier: Any, **fields: Any) -> Any:
    return teacher_student_v0.env(verifier=verifier, **fields)


def make_pop(base_dir: Path, names: Sequence[str], rank: int = 4) -> LoRAPopulation:
    return LoRAPopulation.from_pretrained(base_dir, list(names), rank=rank, dtype=torch.float32, device="cpu")


class Recorder:
    """Wraps a policy and logs (agent, observation, action) for every call of ``act``."""

    def __init__(self, policy: Any, log: list[tuple[str, dict[str, Any], Any]]) -> None:
        self.policy, self.log = policy, log

    def act(self, observation: Any, agent: str) -> Any:
        action = self.policy.act(observation, agent)
        self.log.append((agent, dict(observation), action))
        return action


# ----- the policy ----------------------------------------------------------------------------------------
class FixedTexts:
    """A stand-in population whose generations are given texts (to feed the env hostile model output)."""

    adapter_names = ("a",)

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts, self.calls = list(texts), []

    def generate(self, prompts: Sequence[str], adapters: Sequence[str], **kwargs: Any) -> list[str]:
        start = sum(len(p) for p, _, _ in self.calls)  # cycle through the texts across calls
        self.calls.append((list(prompts), list(adapters), kwargs))
        return [self.texts[(start + i) % len(self.texts)] for i in range(len(prompts))]


def test_policy_returns_raw_text_and_env_scores_bad_text_as_format_error(verifier: Any) -> None:
    hostile = ["", "no answer at all \x00\udcff", "<answer>" + "x" * 5000 + "</answer>"]
    env = make_env(verifier, n_teachers=1, n_students=1, rounds=3, task_types=("deduction",),
                   max_action_chars=1024)  # fmt: skip
    policy = LoRAPolicy(FixedTexts(hostile), "a", max_new_tokens=4, temperature=0.0)  # type: ignore[arg-type]
    assert isinstance(policy, Policy)
    log: list[tuple[str, dict[str, Any], Any]] = []
    records = play(env, {"teacher_0": Recorder(policy, log), "student_0": policy}, seed=0)
    assert [action for _, _, action in log] == hostile  # returned unchanged, one call per turn
    assert records[0].returns["teacher_0"] == -3.0  # three malformed proposals, nothing to solve
    assert env.unwrapped.episode_metrics().invalid_rate == 1.0
    with pytest.raises(TypeError, match="text-mode"):
        policy.act({"phase": 1}, "teacher_0")
    # refused when made (a review: True taken as 1 then refused by the first act; a seed of 2**64 - 1 refused by
    # the second, in mid-episode; a str seed a bare TypeError at the first)
    for field, value in (("max_new_tokens", True), ("temperature", "1"), ("top_p", True), ("seed", 2**64 - 1),
                         ("seed", "x")):  # fmt: skip
        with pytest.raises(ValueError, match=f"{field} must be"):
            LoRAPolicy(FixedTexts(hostile), "a", **{field: value})  # type: ignore[arg-type]


def test_policy_batches_in_one_call_and_prefills_with_the_env_format() -> None:
    fake = FixedTexts(["7\n```\n</answer>"])
    policy = LoRAPolicy(fake, "a", max_new_tokens=5, temperature=0.5, seed=11, prefill=True)  # type: ignore[arg-type]
    observations = [
        {"prompt": "P1", "phase": 2, "task_type": 0, "attempt": 0},
        {"prompt": "P2", "phase": 1, "task_type": 2, "attempt": 1},
    ]
    actions = policy.act_batch(observations, ["student_0", "teacher_0"])
    student_prefix = "\n\n" + format_answer("deduction", "")[: -len("\n```\n</answer>")]
    assert answer_prefill(observations[0]) == student_prefix
    assert actions[0] == student_prefix + "7\n```\n</answer>"
    assert actions[1].startswith("\n\n<think></think>\n<answer>\n```python\n")
    [(prompts, adapters, kwargs)] = fake.calls
    assert prompts == ["P1" + student_prefix, "P2" + answer_prefill(observations[1])]
    assert adapters == ["a", "a"] and kwargs["seed"] == 11 and kwargs["max_new_tokens"] == 5
    policy.act(observations[0], "student_0")
    assert fake.calls[-1][2]["seed"] == 12  # each call samples with the next seed


def test_full_episode_with_lora_policies_through_play(tiny_base_dir: Path, verifier: Any) -> None:
    pop = make_pop(tiny_base_dir, ["teacher_0", "student_0"])
    env = make_env(verifier, n_teachers=1, n_students=1, rounds=2, task_types=("deduction", "abduction"))
    policies = {name: LoRAPolicy(pop, name, max_new_tokens=8, seed=1) for name in ("teacher_0", "student_0")}
    log: list[tuple[str, dict[str, Any], Any]] = []
    [record] = play(env, {a: Recorder(p, log) for a, p in policies.items()}, seed=5)
    assert record.steps == len(log) and record.metrics is not None and record.metrics.n_proposals == 2
    assert [agent for agent, _, _ in log].count("teacher_0") == 2  # one proposal per round
    calls = dict.fromkeys(policies, 0)
    for agent, observation, action in log:
        heading = "## Propose a " if agent == "teacher_0" else "## Solve a "
        assert observation["prompt"].startswith(heading)
        # The action is exactly the adapter's generation for the env's prompt with the policy's k-th seed.
        expected = pop.generate([observation["prompt"]], [agent], max_new_tokens=8, temperature=1.0,
                                seed=1 + calls[agent])  # fmt: skip
        assert action == expected[0]
        calls[agent] += 1
    student_steps = len(log) - 2
    assert record.returns["student_0"] >= -1.0 * student_steps and record.returns["teacher_0"] <= 2.0


# ----- trajectories ---------------------------------------------------------------------------------------
def easy_teacher(env: Any, seed: int) -> ScriptedTeacher:
    return ScriptedTeacher(env, difficulty=0.0, seed=seed)


def randomize_b(pop: LoRAPopulation, name: str, seed: int) -> None:
    """A non-zero ``lora_B``, so that the adapter's outputs differ from the base's and the others'."""
    generator = torch.Generator().manual_seed(seed)
    genome = pop.get_genome(name)
    for key, value in genome.items():
        if ".lora_B." in key:
            genome[key] = torch.randn(value.shape, generator=generator) * 0.5
    pop.set_genome(name, genome)


class CountingPopulation:
    """Delegates to a population and logs the adapters of every ``generate`` call."""

    def __init__(self, pop: LoRAPopulation) -> None:
        self.pop, self.adapter_names, self.calls = pop, pop.adapter_names, []

    def generate(self, prompts: Sequence[str], adapters: Sequence[str], **kwargs: Any) -> list[str]:
        self.calls.append(list(adapters))
        return self.pop.generate(prompts, adapters, **kwargs)


def test_collector_trajectory_equals_agent_by_agent_play(tiny_base_dir: Path, verifier: Any) -> None:
    pop = make_pop(tiny_base_dir, ["t", "s", "u"])
    for i, name in enumerate(pop.adapter_names):
        randomize_b(pop, name, seed=i)
    fields = dict(n_teachers=2, n_students=3, rounds=2, teacher_group_size=2, student_group_size=2,
                  task_types=("deduction", "abduction"))  # fmt: skip
    # Two students share an adapter; the third has its own, so solve batches mix adapters.
    adapters = {"teacher_0": "t", "student_0": "s", "student_1": "s", "student_2": "u"}
    cfg = RolloutConfig(max_new_tokens=10, temperature=0.0, prefill=True, seed=3)
    env = make_env(verifier, **fields)
    spy = CountingPopulation(pop)
    collector = RolloutCollector(spy, adapters, cfg, policies={"teacher_1": easy_teacher(env, 9)})  # type: ignore[arg-type]
    [rollout] = collector.collect(env, episodes=1, seed=21)
    # One generation per phase with adapter-played turns, holding every such turn of the phase.
    phases = [(s.round, s.phase) for s in rollout.steps if s.adapter]
    assert len(spy.calls) == len(dict.fromkeys(phases)) == 4
    assert sorted(a for call in spy.calls for a in call) == sorted(
        s.adapter for s in rollout.steps if s.adapter
    )
    assert {"s", "u"} <= set(spy.calls[1])

    # The same game stepped agent by agent by play(), each LoRA agent generating alone (greedy).
    env2 = make_env(verifier, **fields)
    log: list[tuple[str, dict[str, Any], Any]] = []
    policies = {
        a: LoRAPolicy(pop, n, max_new_tokens=10, temperature=0.0, prefill=True) for a, n in adapters.items()
    }
    policies["teacher_1"] = easy_teacher(env2, 9)  # type: ignore[assignment]
    [record] = play(env2, {a: Recorder(p, log) for a, p in policies.items()}, seed=21)

    assert [(s.agent, s.action) for s in rollout.steps] == [(a, act) for a, _, act in log]
    assert [s.prompt for s in rollout.steps if s.adapter] == [
        o["prompt"] + answer_prefill(o) for a, o, _ in log if a in adapters
    ]
    assert dict(rollout.returns) == record.returns
    assert len(rollout.steps) == record.steps
    solves = [s for s in rollout.steps if s.phase == "solve"]
    assert solves and all(s.action == answer_prefill(o) + s.completion for s, (_, o, _) in zip(
        rollout.steps, log, strict=True) if s.adapter)  # fmt: skip
    assert rollout.metrics == env2.unwrapped.episode_metrics()


def test_collector_keeps_the_sampled_token_ids_for_the_learner(tiny_base_dir: Path, verifier: Any) -> None:
    """Adapter steps carry the ids they were sampled as (they decode to the completion) and the batches hand
    them to the learner; a population without ``generate_tokens`` leaves them unknown (``None``)."""
    pop = make_pop(tiny_base_dir, ["t", "s"])
    randomize_b(pop, "s", seed=1)
    cfg = RolloutConfig(max_new_tokens=8, temperature=1.0, prefill=True, seed=4)
    env = make_env(verifier, n_teachers=1, n_students=1, rounds=1, student_group_size=2)

    def teacher() -> dict[str, Any]:  # valid tasks, so the student adapter plays; fresh for each run
        return {"teacher_0": easy_teacher(env, 9)}

    [rollout] = RolloutCollector(pop, {"student_0": "s"}, cfg, policies=teacher()).collect(env, seed=2)
    played = [s for s in rollout.steps if s.adapter]
    assert played and all(s.completion_ids for s in played)
    assert texts_of(pop.tokenizer, [list(s.completion_ids or ()) for s in played]) == [
        s.completion for s in played
    ]
    batch = grpo_batches([rollout])["s"]
    assert batch.fields()["completion_ids"] == [
        list(s.completion_ids or ()) for s in played if s.adapter == "s"
    ]
    spy = CountingPopulation(pop)  # generate only: the learner re-tokenises
    [again] = RolloutCollector(spy, {"student_0": "s"}, cfg, policies=teacher()).collect(env, seed=2)  # type: ignore[arg-type]
    assert [s.completion for s in again.steps] == [s.completion for s in rollout.steps]
    assert all(s.completion_ids is None for s in again.steps)
    assert grpo_batches([again])["s"].fields()["completion_ids"] is None


# ----- GRPO groups ----------------------------------------------------------------------------------------
class ScriptedPopulation:
    """Answers by row: teacher row 0 a valid identity task (input ``3``, spelled anew in each batch), row 1 a
    malformed proposal; student rows alternate a correct answer and a wrong one."""

    adapter_names = ("T", "S")

    def __init__(self) -> None:
        self.batches: list[tuple[list[str], list[str]]] = []

    def generate(self, prompts: Sequence[str], adapters: Sequence[str], **kwargs: Any) -> list[str]:
        self.batches.append((list(prompts), list(adapters)))
        # the identity spelled anew in each batch: a task the buffer holds already is a duplicate
        spelling = " * 1" * sum(1 for _, batch in self.batches[:-1] if "T" in batch)
        proposals = [format_proposal("def f(x):\n    return x" + spelling, ["3"]), "oops"]
        answers = [format_answer("deduction", "3"), format_answer("deduction", "4")]
        table = {"T": proposals, "S": answers}
        return [table[a][i % 2] for i, a in enumerate(adapters)]


def test_grpo_groups_and_teacher_rewards_by_hand(verifier: Any) -> None:
    env = make_env(verifier, n_teachers=1, n_students=1, rounds=2, teacher_group_size=2, student_group_size=2,
                   task_types=("deduction",), reward_scheme="adversarial")  # fmt: skip
    fake = ScriptedPopulation()
    collector = RolloutCollector(fake, {"teacher_0": "T", "student_0": "S"}, RolloutConfig(max_new_tokens=4))  # type: ignore[arg-type]
    rollouts = collector.collect(env, episodes=2, seed=0)
    # Per round: one batch of the teacher's 2 proposals, one batch of the student's 2 attempts.
    assert [adapters for _, adapters in fake.batches] == [["T", "T"], ["S", "S"]] * 4
    steps = rollouts[0].steps
    assert [(s.agent, s.round, s.attempt, s.verdict, s.reward) for s in steps[:4]] == [
        ("teacher_0", 0, 0, "valid", 0.5),  # adversarial: 1 - solve rate 1/2
        ("teacher_0", 0, 1, "format_error", -1.0),
        ("student_0", 0, 0, "correct", 1.0),
        ("student_0", 0, 1, "wrong", -0.5),
    ]
    batches = grpo_batches(rollouts)
    assert set(batches) == {"T", "S"}
    task_id = steps[0].task_id
    t, s = batches["T"], batches["S"]
    assert t.group_ids == (
        (0, "teacher_0", 0, "propose", ""), (0, "teacher_0", 0, "propose", ""),
        (0, "teacher_0", 1, "propose", ""), (0, "teacher_0", 1, "propose", ""),
        (1, "teacher_0", 0, "propose", ""), (1, "teacher_0", 0, "propose", ""),
        (1, "teacher_0", 1, "propose", ""), (1, "teacher_0", 1, "propose", ""),
    )  # fmt: skip
    assert t.rewards == (0.5, -1.0) * 4 and s.rewards == (1.0, -0.5) * 4
    solve = next(step for step in steps if step.phase == "solve")
    assert s.group_ids[:2] == ((0, "student_0", 0, "solve", solve.prompt),) * 2  # keyed by observation
    assert solve.task_id == task_id
    assert len(set(s.group_ids)) == 4  # 2 episodes x 2 rounds, each a group of 2 attempts
    assert set(t.task_keys) == {("teacher", "deduction")} and set(s.task_keys) == {("student", "deduction")}
    assert t.prompts[0].startswith("## Propose a deduction task") and t.completions[1] == "oops"
    # Each group answers one observation: a single prompt per group id.
    for batch in (t, s):
        by_group: dict[Any, set[str]] = {}
        for gid, prompt in zip(batch.group_ids, batch.prompts, strict=True):
            by_group.setdefault(gid, set()).add(prompt)
        assert all(len(prompts) == 1 for prompts in by_group.values())
    assert dict(rollouts[0].returns) == {"teacher_0": -1.0, "student_0": 1.0}


def test_collector_rejects_bad_setups(verifier: Any) -> None:
    fake = ScriptedPopulation()
    env = make_env(verifier, n_teachers=1, n_students=1)
    with pytest.raises(ValueError, match="missing"):
        RolloutCollector(fake, {"teacher_0": "T"}).episode(env, seed=0)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="unknown adapter"):
        RolloutCollector(fake, {"teacher_0": "nope", "student_0": "S"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_new_tokens"):
        RolloutConfig(max_new_tokens=0)
    # refused when made, not once an episode has begun, nor silently empty (a robustness review)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1, got True"):
        RolloutConfig(max_new_tokens=True)
    # (a review: bools and strings were taken as temperature and top_p, or raised a bare TypeError)
    for field, value in (("temperature", True), ("temperature", "1"), ("top_p", True)):
        with pytest.raises(ValueError, match=f"RolloutConfig.{field} must be"):
            RolloutConfig(**{field: value})
    with pytest.raises(ValueError, match="episodes must be an int >= 0, got -3"):
        RolloutCollector(fake, {"teacher_0": "T", "student_0": "S"}).collect(env, episodes=-3)  # type: ignore[arg-type]
    # numpy's numbers (a seed or budget read from an array) are taken as Python's, as GRPOConfig takes them;
    # numpy's bool is not a number (they were all refused)
    import numpy as np

    config = RolloutConfig(max_new_tokens=np.int64(8), temperature=np.float32(0.5), top_p=np.float64(0.9),
                           seed=np.uint32(3))  # fmt: skip
    assert config == RolloutConfig(max_new_tokens=8, temperature=0.5, top_p=0.9, seed=3)
    assert type(config.seed) is int and type(config.temperature) is float
    with pytest.raises(ValueError, match=r"RolloutConfig\.seed must be an int >= 0"):
        RolloutConfig(seed=np.bool_(True))
    assert (
        RolloutCollector(fake, {"teacher_0": "T", "student_0": "S"}).collect(env, episodes=np.int64(0)) == []
    )  # type: ignore[arg-type]
    policy = LoRAPolicy(fake, "T", max_new_tokens=np.int32(4), temperature=np.float16(1), seed=np.int64(2))  # type: ignore[arg-type]
    assert (type(policy.max_new_tokens), type(policy.temperature), type(policy.seed)) == (int, float, int)
    structured = make_env(verifier, n_teachers=1, n_students=1, mode="structured")
    with pytest.raises(ValueError, match="text-mode"):
        RolloutCollector(fake, {"teacher_0": "T", "student_0": "S"}).episode(structured, seed=0)  # type: ignore[arg-type]


# ----- learning -------------------------------------------------------------------------------------------
class EasyTeacher:
    """Proposes deduction tasks of constant or identity programs on small ints."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def act(self, observation: Any, agent: str) -> str:
        k, x = self.rng.randint(0, 9), self.rng.randint(0, 9)
        body = "return x" if self.rng.random() < 0.5 else f"return {k}"
        return format_proposal(f"def f(x):\n    {body}", [str(x)])


@pytest.fixture(scope="module")
def trained_base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test base pretrained for longer, so that a prefilled answer can close its block (~30 s)."""
    config = dataclasses.replace(TEST_BASE_CONFIG, steps=200, warmup_steps=5, corpus_documents=600)
    return build_tiny_base(tmp_path_factory.mktemp("trained-base"), config, progress=False, num_threads=1)


def student_mean(rollouts: Sequence[EpisodeRollout]) -> float:
    rewards = [s.reward for r in rollouts for s in r.steps if s.agent == "student_0"]
    return sum(rewards) / len(rewards)


@pytest.mark.slow
def test_short_grpo_run_raises_student_reward(trained_base_dir: Path, verifier: Any) -> None:
    pop = make_pop(trained_base_dir, ["student_0"], rank=8)
    fields = dict(n_teachers=2, n_students=1, rounds=2, student_group_size=8, task_types=("deduction",))
    env = make_env(verifier, **fields)
    cfg = RolloutConfig(max_new_tokens=8, temperature=1.0, prefill=True)
    learner = GRPOLearner(pop, GRPOConfig(learning_rate=2e-2, max_new_tokens=8, loss_type="dapo"))

    def collect(seed: int, episodes: int) -> list[EpisodeRollout]:
        teachers = {f"teacher_{i}": EasyTeacher(seed * 10 + i) for i in range(2)}
        return RolloutCollector(pop, {"student_0": "student_0"}, cfg, teachers).collect(env, episodes, seed)

    base = {n: p.detach().clone() for n, p in pop.model.named_parameters() if "lora_" not in n}
    adapter = {k: v.clone() for k, v in pop.get_genome("student_0").items()}
    before = student_mean(collect(seed=1000, episodes=4))  # 64 attempts
    history = []
    for iteration in range(30):
        batches = grpo_batches(collect(seed=iteration, episodes=2))  # 64 attempts per update
        history.append(batches["student_0"].mean_reward)
        stats = update_adapters(learner, batches)
        assert not stats["student_0"].skipped
    after = student_mean(collect(seed=1000, episodes=4))
    # Measured here: -0.848 -> -0.641 (+0.21; other RolloutConfig seeds +0.18 and +0.20; lr 3e-2 can collapse).
    # The tiny base learns to close its answer block (format error -1 -> well-formed wrong answer -0.5),
    # not the programs' semantics.
    assert after >= before + 0.12, f"student mean reward {before:.3f} -> {after:.3f} (training: {history})"
    assert all(torch.equal(p.detach(), base[n]) for n, p in pop.model.named_parameters() if "lora_" not in n)
    assert any(not torch.equal(v, adapter[k]) for k, v in pop.get_genome("student_0").items())


@pytest.mark.slow
def test_example_02_runs_with_tiny_flags(tiny_base_dir: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "examples" / "02_lora_selfplay.py"
    flags = ["--base-dir", str(tiny_base_dir), "--iterations", "2", "--episodes", "1", "--rounds", "1",
             "--group-size", "2", "--max-new-tokens", "8", "--self-play"]  # fmt: skip
    done = subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("iteration ")]
    assert len(lines) == 2 and all("self/teacher" in line and "self loss" in line for line in lines)
    assert all(
        re.search(r"self loss [-+]\d\.\d{4} cut teacher \d+/\d+( student \d+/\d+)?$", line) for line in lines
    ), lines


class _TwoMessages:
    """A teacher proposing one program and inputs twice with two messages; a student answering."""

    adapter_names = ("T", "S")

    def generate(self, prompts: Sequence[str], adapters: Sequence[str], **kwargs: Any) -> list[str]:
        out = []
        for i, adapter in enumerate(adapters):
            if adapter == "T":
                out.append(format_proposal("def f(x):\n    return x + 1", ["1", "2", "3", "4"],
                                           message=("add one", "increment")[i % 2]))  # fmt: skip
            else:
                out.append(format_answer("induction", "def f(x):\n    return x + 1"))
        return out


def test_a_student_group_holds_one_observation_when_task_ids_coincide(verifier: Any) -> None:
    """An induction task's id leaves out the teacher's message, which the student sees: two proposals of
    one program and inputs with different messages were one GRPO group of two observations."""
    env = make_env(verifier, n_teachers=1, n_students=1, rounds=1, teacher_group_size=2, student_group_size=2,
                   task_types=("induction",))  # fmt: skip
    [rollout] = RolloutCollector(
        _TwoMessages(), {"teacher_0": "T", "student_0": "S"}, RolloutConfig()
    ).collect(env, seed=0)
    solves = [step for step in rollout.steps if step.phase == "solve"]
    assert len({step.task_id for step in solves}) == 1 and len({step.prompt for step in solves}) == 2
    batch = grpo_batches([rollout])["S"]
    by_group: dict[Any, set[str]] = {}
    for gid, prompt in zip(batch.group_ids, batch.prompts, strict=True):
        by_group.setdefault(gid, set()).add(prompt)
    assert len(by_group) == 2 and all(len(prompts) == 1 for prompts in by_group.values())
