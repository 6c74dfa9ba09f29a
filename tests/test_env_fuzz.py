"""Fuzz: thousands of hostile actions with the real verifier: no crash, no hang, same seed same trajectory."""

from __future__ import annotations

import numpy as np
import pytest

from populora_env import teacher_student_v0
from populora_env.text_format import format_answer, format_proposal

SNIPPETS = [
    "def f(x):\n    return x + 1",
    "def f(x):\n    while True:\n        pass",
    "def f(x):\n    import os\n    return os.getpid()",
    "def f(x):\n    return [x] * 10**9",
    "def f(x):\n    return id(x)",
    "def f(x):\n    return f(x)",
    "def f(*a):\n    return a",
    "lambda: 0",
    "def f(x):\n\treturn '\udcff'",
]
LITERALS = ["1", "'a'", "[1, 2], 3", "None", "1e999", "(", "x", "{1: [2]}", "'\x00'", "\udcff", ""]


def _random_text(rng: np.random.Generator) -> str:
    kind = int(rng.integers(5))
    if kind == 0:  # any code point, surrogates and NUL included, any length (some over the cap)
        n = int(rng.choice([0, 1, 10, 300, 9000]))
        return "".join(chr(int(c)) for c in rng.integers(0, 0x110000, size=n))
    if kind in (1, 2):  # well-formed envelopes around hostile programs and literals
        program = SNIPPETS[int(rng.integers(len(SNIPPETS)))]
        inputs = [LITERALS[int(i)] for i in rng.integers(len(LITERALS), size=int(rng.integers(1, 5)))]
        return format_proposal(program, inputs, message=str(rng.integers(9)) if kind == 2 else "")
    if kind == 3:
        tag = ["deduction", "abduction", "induction"][int(rng.integers(3))]
        body = (SNIPPETS + LITERALS)[int(rng.integers(len(SNIPPETS) + len(LITERALS)))]
        return format_answer(tag, body)
    return "<answer>```python\n" * int(rng.integers(1, 50)) + "```</answer>" * int(rng.integers(0, 3))


def _rollout(env, rng: np.random.Generator, steps: int, text: bool) -> list:
    trace = []
    env.reset(seed=int(rng.integers(1 << 30)))
    for _ in range(steps):
        agent = env.agent_selection
        _, reward, term, trunc, info = env.last()
        trace.append((agent, reward, sorted((k, repr(v)) for k, v in info.items())))
        if term or trunc:
            env.step(None)
            if not env.agents:
                env.reset(seed=int(rng.integers(1 << 30)))
            continue
        if text:
            env.step(_random_text(rng))
        elif agent.startswith("teacher"):  # half in the space, half outside it
            nvec = env.action_space(agent).nvec
            env.step(rng.integers(nvec) if rng.random() < 0.5 else rng.integers(-2, 60, size=nvec.shape))
        else:
            env.step(int(rng.integers(-2, 7)))
    return trace


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["text", "structured"])
def test_fuzz_no_crash_and_deterministic(verifier, mode):
    kwargs = {
        "verifier": verifier,
        "mode": mode,
        "n_teachers": 2,
        "n_students": 2,
        "rounds": 3,
        "n_seed_tasks": 4,
        "illegal_action": "penalize",
    }
    steps = 2000 if mode == "text" else 3000
    first = _rollout(teacher_student_v0.env(**kwargs), np.random.default_rng(123), steps, mode == "text")
    second = _rollout(teacher_student_v0.env(**kwargs), np.random.default_rng(123), steps, mode == "text")
    assert first == second
    verdicts = {dict(info).get("verdict") for _, _, info in first}
    assert "'format_error'" in verdicts  # hostile actions were really judged ...
    assert verdicts & {"'wrong'", "'correct'"}  # ... and some proposals were valid, so students played


def test_fuzz_structured_out_of_space_actions_raise_and_change_nothing(verifier):
    """With ``illegal_action="raise"`` every action outside its space (or masked) is a ``ValueError`` that
    leaves the game as it was: the next legal action plays exactly as if the bad one had never been sent."""
    kwargs = {"verifier": verifier, "mode": "structured", "n_teachers": 2, "n_students": 2, "rounds": 3,
              "n_seed_tasks": 4}  # fmt: skip
    rng = np.random.default_rng(7)
    clean, noisy = teacher_student_v0.env(**kwargs), teacher_student_v0.env(**kwargs)
    clean.reset(seed=5)
    noisy.reset(seed=5)
    raised = 0
    for _ in range(3000):
        agent = clean.agent_selection
        assert noisy.agent_selection == agent
        obs, _, term, trunc, _ = clean.last()
        if term or trunc:
            clean.step(None)
            noisy.step(None)
            if not clean.agents:
                seed = int(rng.integers(1 << 30))
                clean.reset(seed=seed)
                noisy.reset(seed=seed)
            continue
        space = clean.action_space(agent)
        if agent.startswith("teacher"):
            legal = rng.integers(space.nvec)
            bad = rng.integers(-3, 60, size=space.nvec.shape)
            out_of_space = not space.contains(bad)
        else:
            mask = obs["action_mask"]
            legal = int(rng.choice(np.flatnonzero(mask)))
            bad = int(rng.integers(-3, 9))
            out_of_space = not (0 <= bad < len(mask) and mask[bad])
        if out_of_space:
            with pytest.raises(ValueError):
                noisy.step(bad)
            raised += 1
        clean.step(legal)
        noisy.step(legal)
        assert clean.rewards == noisy.rewards and clean.infos == noisy.infos
    assert raised > 1000


def test_a_str_subclass_action_is_read_as_its_characters(verifier):
    """A str subclass whose ``__len__`` lied passed the length cap (a 19 000-character proposal verified
    with ``max_action_chars=8192``), and one whose methods raised escaped ``step`` (a text-mode audit)."""

    class LyingLength(str):
        def __len__(self) -> int:
            return 0

    class Raising(str):
        def replace(self, *args: object) -> str:  # type: ignore[override]
            raise RuntimeError("a str method of the action's own")

        def strip(self, *args: object) -> str:  # type: ignore[override]
            raise RuntimeError("a str method of the action's own")

    long = format_proposal("def f(x):\n    return x + 1\n# " + "x" * 3000, ["3"], reasoning="r" * 16000)

    class Claiming:  # no str at all, though isinstance(..., str) believes its __class__ (a review)
        __class__ = str  # type: ignore[assignment]

    for action, status in ((LyingLength(long), "too_long"), (Raising("<answer></answer>"), None),
                           (Claiming(), "not_a_string")):  # fmt: skip
        env = teacher_student_v0.env(task_types=("deduction",), verifier=verifier)
        env.reset(seed=0)
        env.step(action)
        info = env.infos["teacher_0"]
        assert info["verdict"] == "format_error", info
        assert status is None or info["status"] == status, info
