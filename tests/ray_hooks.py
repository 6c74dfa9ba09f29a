"""Learner plug-ins that Ray's worker processes can import (``worker_process_setup_hook``), for the tests
that a member whose learner raises, or whose learner actor dies, is reported and skipped on Ray as locally."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import torch

from evolve.learners import LEARNERS, LearnerConfig, ReinforceLearner


def flaky_first_param(policy: Any, config: LearnerConfig) -> Any:
    """REINFORCE, except that a member whose first weight is positive poisons its weights with NaN and
    raises: which members fail depends only on their genomes, so both backends see the same failures."""
    learner = ReinforceLearner(policy, config)
    update = learner.update

    def flaky(policy: Any, experience: Any) -> Any:
        if float(next(iter(policy.parameters())).flatten()[0]) > 0:
            with torch.no_grad():
                for parameter in policy.parameters():
                    parameter.fill_(float("nan"))
            raise RuntimeError("learner exploded")
        return update(policy, experience)

    learner.update = flaky  # type: ignore[method-assign]
    return learner


def flaky_or_diverging(policy: Any, config: LearnerConfig) -> Any:
    """As ``flaky_first_param``, and a member whose first weight is not positive but its last one is
    poisons its weights with NaN without raising (the backends' own finiteness check reports it, naming the
    member: the Ray actor's message named none, and metrics.jsonl differed; an audit)."""
    learner = flaky_first_param(policy, config)
    update = learner.update

    def diverging(policy: Any, experience: Any) -> Any:
        stats = update(policy, experience)
        if float(list(policy.parameters())[-1].flatten()[-1]) > 0:
            with torch.no_grad():
                for parameter in policy.parameters():
                    parameter.fill_(float("nan"))
        return stats

    learner.update = diverging  # type: ignore[method-assign]
    return learner


def _failing_first_param(policy: Any, config: LearnerConfig, fail: Any) -> Any:
    """REINFORCE, except that for a member whose first weight is positive ``fail()`` runs first (as in
    ``flaky_first_param``, the failing members depend only on their genomes)."""
    learner = ReinforceLearner(policy, config)
    update = learner.update

    def failing(policy: Any, experience: Any) -> Any:
        if float(next(iter(policy.parameters())).flatten()[0]) > 0:
            fail()
        return update(policy, experience)

    learner.update = failing  # type: ignore[method-assign]
    return learner


def dying_first_param(policy: Any, config: LearnerConfig) -> Any:
    """As ``flaky_first_param``, but the failing members' learner ends its process (``os._exit``) instead of
    raising: only ever run on a Ray actor."""
    return _failing_first_param(policy, config, lambda: os._exit(3))


def hanging_first_param(policy: Any, config: LearnerConfig) -> Any:
    """As ``dying_first_param``, but the failing members' learner hangs (a lost node, a deadlock): only ever
    run on a Ray actor, with ``ray_timeout_s``."""
    return _failing_first_param(policy, config, lambda: time.sleep(3600))


def thread_count(policy: Any, config: LearnerConfig) -> Any:
    """REINFORCE reporting as its loss the torch thread count its update ran under."""
    learner = ReinforceLearner(policy, config)
    update = learner.update

    def counting(policy: Any, experience: Any) -> Any:
        return dataclasses.replace(update(policy, experience), loss=float(torch.get_num_threads()))

    learner.update = counting  # type: ignore[method-assign]
    return learner


_LEARNERS = {
    "thread_count": thread_count,
    "flaky_first_param": flaky_first_param,
    "flaky_or_diverging": flaky_or_diverging,
    "dying_first_param": dying_first_param,
    "hanging_first_param": hanging_first_param,
}


def register() -> None:
    """Registers the learners above in ``evolve.learners.LEARNERS`` (in this process)."""
    LEARNERS.update(_LEARNERS)


def unregister() -> None:
    """Removes them again (a test's clean-up in the test process)."""
    for name in _LEARNERS:
        LEARNERS.pop(name, None)
