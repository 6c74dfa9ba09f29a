"""TeacherStudent-v0 throughput, side by side with PettingZoo's own tic-tac-toe AEC env.

Usage:
    python bench/env.py [--steps 20000] [--rounds 20]

Prints one JSON line with:
  * stub_*: AEC steps per second (and microseconds per step) with a stub verifier that answers instantly,
    i.e. the env's own overhead (target: <= 50 us per step), in text and structured mode, through
    ``env()`` (with PettingZoo's order-enforcing wrapper) and, for text, through ``raw_env`` too;
  * real_text_steps_per_s: text mode with the real verifier, scripted teachers and reference students;
  * real_structured_rounds_per_s: rounds per second of a 4 teachers x 4 students structured game with
    scripted teachers and executing students (real verifier);
  * peer_tictactoe_steps_per_s: ``pettingzoo.classic.tictactoe_v3`` with random legal actions, the
    same loop (``last`` + ``step``);
and the ratios of the stub figures to the peer (``null``, with a ``peer_tictactoe`` note, where pygame, which
tic-tac-toe imports, is missing: ``pip install -e ".[bench]"``). Each stub and peer figure is the median of ``--repeats``
runs. Actions are precomputed where possible so that the figures time the env, not the policies.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from populora_env import teacher_student_v0
from populora_env.policies import ExecutingStudent, ReferenceStudent, ScriptedTeacher
from populora_env.text_format import format_answer, format_proposal


@dataclass(frozen=True)
class _Execution:
    status: str
    output: str | None
    detail: str = ""


_OK = _Execution("ok", "1")


class StubVerifier:
    """Answers every call at once (every program returns 1): isolates the env's own cost.

    Its answer is one shared frozen record: building a fresh one per run was the harness's cost, not the
    env's (about 8% of the structured figure, measured with valgrind's instruction counts).
    """

    def run(self, program: str, args: str) -> _Execution:
        return _OK

    def run_many(self, items: list[tuple[str, str]]) -> list[_Execution]:
        return [_OK] * len(items)

    def check_deduction(self, program: str, args: str, answer: str) -> bool:
        return True

    def check_abduction(self, program: str, output: str, answer: str) -> bool:
        return True

    def check_induction(self, answer_program: str, pairs: list[tuple[str, str]]) -> float:
        return 1.0


def _loop(env, choose, steps: int) -> float:
    """Steps ``env`` with ``choose(agent, obs)`` for ``steps`` live steps; returns steps per second."""
    env.reset(seed=0)
    done_steps = 0
    start = time.perf_counter()
    while done_steps < steps:
        agent = env.agent_selection
        obs, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            if not env.agents:
                env.reset()
            continue
        env.step(choose(agent, obs))
        done_steps += 1
    return steps / (time.perf_counter() - start)


def stub_text(steps: int, raw: bool = False) -> float:
    factory = teacher_student_v0.raw_env if raw else teacher_student_v0.env
    env = factory(verifier=StubVerifier(), n_teachers=4, n_students=4, rounds=10)
    proposal = {
        "deduction": format_proposal("def f(x):\n    return x", ["1"]),
        "abduction": format_proposal("def f(x):\n    return x", ["1"]),
        "induction": format_proposal("def f(x):\n    return x", ["1", "2"], message="id"),
    }
    types = ("deduction", "abduction", "induction")
    answers = {t: format_answer(t, "1" if t != "induction" else "def f(x):\n    return 1") for t in types}

    def choose(agent, obs):
        task_type = types[int(obs["task_type"])]
        return proposal[task_type] if agent.startswith("teacher") else answers[task_type]

    return _loop(env, choose, steps)


def stub_structured(steps: int) -> float:
    env = teacher_student_v0.env(
        verifier=StubVerifier(), mode="structured", n_teachers=4, n_students=4, rounds=10
    )
    program = ScriptedTeacher(env, 0.5, seed=0).act(None, "teacher_0")

    def choose(agent, obs):
        # candidates fill the mask from index 0, so 0 is always legal: a constant, precomputed answer
        # (finding the first legal index with numpy per step was about a tenth of this figure: harness cost)
        return program if agent.startswith("teacher") else 0

    return _loop(env, choose, steps)


def real_text(steps: int) -> float:
    env = teacher_student_v0.env(n_teachers=2, n_students=2, rounds=10)
    teachers = {a: ScriptedTeacher(env, 0.5, seed=i) for i, a in enumerate(env.possible_agents)}
    student = ReferenceStudent(env, skill=0.7, seed=0)

    def choose(agent, obs):
        return teachers[agent].act(obs, agent) if agent.startswith("teacher") else student.act(obs, agent)

    return _loop(env, choose, steps)


def real_structured_rounds(rounds: int) -> float:
    env = teacher_student_v0.env(mode="structured", n_teachers=4, n_students=4, rounds=rounds)
    policies = {a: ScriptedTeacher(env, 0.5, seed=i) for i, a in enumerate(env.possible_agents[:4])}
    policies |= {a: ExecutingStudent(env, 0.7, seed=i) for i, a in enumerate(env.possible_agents[4:])}
    env.reset(seed=0)
    start = time.perf_counter()
    for agent in env.agent_iter():
        obs, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else policies[agent].act(obs, agent))
    return rounds / (time.perf_counter() - start)


def peer_tictactoe(steps: int) -> float:
    from pettingzoo.classic import tictactoe_v3

    env = tictactoe_v3.env()
    rng = np.random.default_rng(0)

    def choose(agent, obs):
        return int(rng.choice(np.flatnonzero(obs["action_mask"])))

    return _loop(env, choose, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="timed steps per stub/peer figure")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of the 4x4 structured game")
    parser.add_argument("--repeats", type=int, default=3, help="runs per stub/peer figure (median kept)")
    args = parser.parse_args()

    def median_rate(fn, *fn_args) -> float:  # the first run of a config also pays one-time warm-up costs
        return statistics.median(fn(*fn_args) for _ in range(args.repeats))

    print("peer tictactoe ...", file=sys.stderr)
    try:
        peer: float | None = median_rate(peer_tictactoe, args.steps)
        peer_note = None
    except ImportError as exc:  # tic-tac-toe imports pygame: the `bench` extra
        peer, peer_note = None, f"missing ({exc}); pip install -e '.[bench]'"
        print(f"peer tictactoe: {peer_note}", file=sys.stderr)
    print("stub text / structured ...", file=sys.stderr)
    s_text, s_struct = median_rate(stub_text, args.steps), median_rate(stub_structured, args.steps)
    s_raw = median_rate(stub_text, args.steps, True)
    print("real verifier ...", file=sys.stderr)
    r_text = real_text(max(200, args.steps // 50))
    r_rounds = real_structured_rounds(args.rounds)
    result = {
        "stub_text_steps_per_s": round(s_text, 1),
        "stub_text_us_per_step": round(1e6 / s_text, 2),
        "stub_text_raw_env_us_per_step": round(1e6 / s_raw, 2),
        "stub_structured_steps_per_s": round(s_struct, 1),
        "stub_structured_us_per_step": round(1e6 / s_struct, 2),
        "real_text_steps_per_s": round(r_text, 1),
        "real_structured_4x4_rounds_per_s": round(r_rounds, 3),
        "peer_tictactoe_steps_per_s": None if peer is None else round(peer, 1),
        "ratio_stub_text_vs_tictactoe": None if peer is None else round(s_text / peer, 3),
        "ratio_stub_structured_vs_tictactoe": None if peer is None else round(s_struct / peer, 3),
    }
    if peer_note:
        result["peer_tictactoe"] = peer_note
    print(json.dumps(result))


if __name__ == "__main__":
    main()
