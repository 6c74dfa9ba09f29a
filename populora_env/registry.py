"""Registers ``populora/TeacherStudent-v0`` with PettingZoo's registry (AEC and parallel)."""

from __future__ import annotations

import pettingzoo

ENV_ID = "populora/TeacherStudent-v0"


def register_envs() -> None:
    """Registers the env ids once (idempotent: a second call does not re-register or warn)."""
    if ENV_ID not in pettingzoo.aec_registry:
        pettingzoo.register("aec", ENV_ID, entry_point="populora_env.teacher_student_v0:env")
    if ENV_ID not in pettingzoo.parallel_registry:
        pettingzoo.register("parallel", ENV_ID, entry_point="populora_env.teacher_student_v0:parallel_env")
