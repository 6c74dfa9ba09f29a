"""populora-env: population-based teacher/student self-play with verifiable rewards.

Importing the package registers ``populora/TeacherStudent-v0`` with PettingZoo's registry::

    import pettingzoo, populora_env
    env = pettingzoo.make("aec", "populora/TeacherStudent-v0", n_teachers=2, n_students=2)
"""

from __future__ import annotations

from populora_env import teacher_student_v0
from populora_env.play import EpisodeRecord, Policy, play
from populora_env.registry import register_envs

register_envs()  # "populora/TeacherStudent-v0" in pettingzoo's aec and parallel registries (idempotent)

__all__ = ["EpisodeRecord", "Policy", "play", "teacher_student_v0"]
