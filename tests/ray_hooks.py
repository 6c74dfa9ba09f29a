"""A learner plug-in that Ray's worker processes can import (``worker_process_setup_hook``), for the test
that a member whose learner raises is reported and skipped the same way on Ray as locally."""

from __future__ import annotations

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


def register() -> None:
    """Registers ``flaky_first_param`` in ``evolve.learners.LEARNERS`` (in this process)."""
    LEARNERS["flaky_first_param"] = flaky_first_param
