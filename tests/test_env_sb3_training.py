"""SB3 end to end: MaskablePPO trained on a structured-mode student beats a random student on held-out rounds."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest

from populora_env import dsl, teacher_student_v0
from populora_env.wrappers import SingleRoleEnv

sb3_contrib = pytest.importorskip("sb3_contrib")
torch = pytest.importorskip("torch")
Logger = pytest.importorskip("stable_baselines3.common.logger").Logger


class PoolTeacher:
    """Proposes programs drawn from a fixed pool: recurring tasks with fresh distractors and shuffles."""

    def __init__(self, pool: list[dsl.DslProgram], seed: int) -> None:
        self.pool = pool
        self.rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, observation, agent):
        return self.pool[int(self.rng.integers(len(self.pool)))].encode()


def _student_env(verifier, pool, seed):
    env = teacher_student_v0.env(
        verifier=verifier, mode="structured", n_teachers=1, n_students=1, rounds=16,
        task_types=("deduction",), n_seed_tasks=1, n_candidates=4,
    )  # fmt: skip
    return SingleRoleEnv(env, "student_0", {"teacher_0": PoolTeacher(pool, seed)})


def _accuracy(env, act, episodes: int, seed: int) -> float:
    correct = total = 0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            obs, _, done, _, info = env.step(act(obs, env))
            correct += info["verdict"] == "correct"
            total += 1
    return correct / total


@pytest.mark.slow
def test_maskable_ppo_student_beats_random(verifier):
    rng = random.Random(0)
    pool = [dsl.random_program(rng, 6, 0.3) for _ in range(4)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small MLP: threads only contend on a shared CI box
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            model = sb3_contrib.MaskablePPO(
                "MultiInputPolicy", _student_env(verifier, pool, seed=0),
                n_steps=128, batch_size=64, n_epochs=4, learning_rate=1e-3, gamma=0.0, seed=0,
            )  # fmt: skip
            model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default makes a folder in /tmp
            model.learn(3000)
        held_out = _student_env(verifier, pool, seed=1000)  # new episodes: new distractors and shuffles
        ppo = _accuracy(
            held_out,
            lambda o, e: int(model.predict(o, action_masks=e.action_masks(), deterministic=True)[0]),
            episodes=20,
            seed=10_000,
        )
    finally:
        torch.set_num_threads(threads)
    choice = np.random.default_rng(0)
    rand = _accuracy(held_out, lambda o, e: int(choice.choice(np.flatnonzero(o["action_mask"]))), 20, 10_000)
    assert rand < 0.45  # k = 4 candidates (fewer when distractors coincide)
    assert ppo > rand + 0.12, (ppo, rand)
