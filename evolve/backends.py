"""Where matches are played and members learn: in this process (``local``) or on Ray actors (``ray``).

The coordinator (``run_pbt``) keeps rating, selection and operators and draws every seed, so both backends
give the same run for the same seed. On Ray, one episode actor owns the env and its verifier and plays a
generation's episodes in order (a member's sampling generator runs through its episodes in sequence, as
locally); every evolving member slot is a plain Ray actor that runs that member's learner. To use a
cluster, start Ray there (``ray start --head``) and set ``PBTConfig.ray_address`` to ``"auto"`` or
``"ray://<head>:10001"``; ``None`` starts a local instance.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import numbers
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from evolve.genome import check_finite
from evolve.learners import LEARNERS
from evolve.members import POLICIES
from evolve.protocols import Transition
from evolve.ratings import MatchResult, MemberMatchmaker, RatingTable
from evolve.runlog import LearnerFailure, LearnerInfo, finite_or_none
from populora_env import teacher_student_v0
from populora_env.credit import ProposalLedger
from populora_env.game import TeacherStudentConfig
from populora_env.metrics import EpisodeMetrics
from populora_env.play import PhasePlan

if TYPE_CHECKING:
    from evolve.pbt import PBTConfig
    from evolve.population import Member

logger = logging.getLogger(__name__)

Losses = dict[str, float | None]


@dataclass(frozen=True)
class PlayOutcome:
    """One generation of matches.

    Attributes:
        transitions: each member's decisions, in play order.
        results: teacher-vs-student attempt outcomes, in play order.
        metrics: the env's arms-race metrics per episode.
        returns: each member's summed reward per role over the generation.
        illegal: each member's count of illegal actions (paid the format penalty), members with any only.
        buffer: the env's task buffer after the generation (``TeacherStudentEnv.buffer_state``) when its
            config has ``persist_buffer`` on, else ``None``.
    """

    transitions: dict[int, list[Transition]]
    results: list[MatchResult]
    metrics: list[EpisodeMetrics]
    returns: dict[int, dict[str, float]]
    illegal: dict[int, int] = dataclasses.field(default_factory=dict)
    buffer: dict[str, Any] | None = None


class Backend(Protocol):
    """Plays a generation and runs the members' learners."""

    env: Any
    """An env instance for building scripted members (they read its config and pending turn)."""

    def play(
        self,
        members: Sequence[Member],
        sampling_seeds: Mapping[int, int],
        seatings: Sequence[Mapping[str, int]],
        seeds: Sequence[int],
        buffer: Mapping[str, Any] | None = None,
    ) -> PlayOutcome:
        """Reseeds members' samplers, then plays one episode per seating (agent -> member id), from the
        task buffer ``buffer`` (``persist_buffer``; ``None``: the seed tasks)."""
        ...

    def learn(
        self, members: Sequence[Member], outcome: PlayOutcome, generation: int
    ) -> tuple[Losses, LearnerInfo, list[LearnerFailure]]:
        """Runs each evolving member's learner on its transitions; a raising learner is undone and reported.
        Returns the losses and the learners' ``LearnStats.info`` by member, and the failures."""
        ...

    def close(self) -> None:
        """Releases the backend's resources."""
        ...


def _role(agent: str) -> Any:
    return "teacher" if agent.startswith("teacher") else "student"


def _sample_record(policy: Any, observation: Any, action: Any) -> Any:
    """The policy's ``sample_record`` of an action it just took (``None`` if it has none)."""
    record = getattr(policy, "sample_record", None)
    return record(observation, action) if callable(record) else None


def play_episodes(
    env: Any,
    matchmaker: MemberMatchmaker,
    policies: Mapping[int, Any],
    seatings: Sequence[Mapping[str, int]],
    seeds: Sequence[int],
    buffer: Mapping[str, Any] | None = None,
) -> PlayOutcome:
    """Plays one episode per seating, episode ``i`` reset with ``seeds[i]``, recording every decision.

    With ``persist_buffer`` on in the env's config, the episodes start from the task buffer ``buffer`` (a
    ``buffer_state()``; ``None``: the seed tasks) and carry it from one to the next, and the outcome holds
    the buffer they leave: the caller keeps it (a checkpoint, the next generation, another process), so
    that a generation depends on what is sent, not on the env object that played the last one.

    A student's decision is credited with the reward its seat received before its next decision (its
    attempt's verified reward). A teacher's proposal is credited with its own reward from the env's
    resolution info (``populora_env.credit``), not with the round's summed payout, so each of a
    ``teacher_group_size`` group of proposals gets what it earned. Teacher transitions are appended when
    their round resolves. Policies with ``act_batch`` answer all their turns of a game phase in one call.
    """
    transitions: dict[int, list[Transition]] = {m: [] for m in policies}
    returns: dict[int, dict[str, float]] = {m: {} for m in policies}
    metrics, results = [], []
    illegal: dict[int, list[str]] = {}  # member -> its illegal actions (paid the format penalty)
    persist = bool(env.unwrapped.config.persist_buffer)
    if persist:
        env.unwrapped.load_buffer_state(buffer)
    for episode, (seats, seed) in enumerate(zip(seatings, seeds, strict=True)):
        matchmaker.seat(seats)
        env.reset(seed=int(seed))
        plan = PhasePlan(policies)
        # a student's last decision (observation, action, sample, refused), credited at its next turn
        pending: dict[str, tuple[Any, Any, Any, bool]] = {}
        # proposals (seat, observation, action, sample, refused), paid at their round's resolution
        ledger: ProposalLedger[tuple[str, Any, Any, Any, bool]] = ProposalLedger()
        for agent in env.agent_iter():
            observation, reward, terminated, truncated, _ = env.last()
            member, role = seats[agent], _role(agent)
            returns[member][role] = returns[member].get(role, 0.0) + float(reward)
            if agent in pending:  # the reward since this seat's last decision is that decision's credit
                obs, action, sample, refused = pending.pop(agent)
                transitions[member].append(
                    Transition(agent, role, obs, action, float(reward), episode, sample, refused)
                )
            if terminated or truncated:
                env.step(None)
                continue
            try:
                action = plan.action(env, agent, observation, policies, seats)
            except Exception as error:  # a policy's own bug: said with the member it belongs to
                raise RuntimeError(
                    f"member {member}'s policy ({type(policies[member]).__name__}) raised while playing {agent} "
                    f"in episode {episode} of the generation: {type(error).__name__}: {error}"
                ) from error
            sample = _sample_record(policies[member], observation, action)
            env.step(action)
            refused = env.unwrapped.infos.get(agent, {}).get("status") == "illegal_action"
            if refused:
                illegal.setdefault(member, []).append(f"{agent}: {action!r:.80}")
            if role == "teacher":
                ledger.record(env, agent, (agent, observation, action, sample, refused))
            else:
                pending[agent] = (observation, action, sample, refused)
            for (teacher, obs, proposal, sample, refused), paid in ledger.settle(env):
                transitions[seats[teacher]].append(
                    Transition(teacher, "teacher", obs, proposal, paid, episode, sample, refused)
                )
        if unpaid := ledger.unsettled():
            raise RuntimeError(f"episode {episode}: proposals never resolved: {unpaid}")
        metrics.append(env.unwrapped.episode_metrics())
        results += matchmaker.drain()
    for member, actions in illegal.items():
        logger.warning(
            "member %d played %d illegal action(s), each paid the format penalty; first: %s",
            member,
            len(actions),
            actions[0],
        )
    left = env.unwrapped.buffer_state() if persist else None
    return PlayOutcome(transitions, results, metrics, returns, {m: len(a) for m, a in illegal.items()}, left)


def learn_stats(stats: Any, member_id: int, learner: Any) -> tuple[float | None, dict[str, float | None]]:
    """A learner's ``update`` result as ``(loss, info)``: from ``LearnStats``, or any object with a number as
    ``loss`` and, optionally, a mapping of names to numbers as ``info`` (``None`` or a float failed as
    "'NoneType' object has no attribute 'loss'", naming neither the learner nor the rule; a review). The info
    comes sorted by name; the loss and the info's values are floats, or ``None`` where not finite (JSON has
    no NaN)."""
    who = f"member {member_id}'s learner ({type(learner).__name__})"
    loss = getattr(stats, "loss", None)
    if isinstance(loss, bool) or not isinstance(loss, numbers.Real):
        raise TypeError(
            f"{who}: update() must return evolve.protocols.LearnStats(loss, samples), got "
            f"{type(stats).__name__} {stats!r:.60}"
        )
    info = getattr(stats, "info", None)
    info = {} if info is None else info
    if not isinstance(info, Mapping):
        raise TypeError(
            f"{who}: LearnStats.info must be a mapping of names to numbers, got {type(info).__name__}"
        )
    values = {}
    for name, value in info.items():
        number = _scalar(value)
        if not isinstance(name, str) or number is None:
            raise TypeError(
                f"{who}: LearnStats.info must map names (str) to numbers, got {name!r}: {value!r:.40}"
            )
        values[name] = number
    return finite_or_none(loss), {name: finite_or_none(values[name]) for name in sorted(values)}


def _scalar(value: Any) -> numbers.Real | None:
    """A real number (not a bool) as it is, a 0-d tensor or array (``grad_norm`` as ``clip_grad_norm_``
    returns it) as its number; ``None`` for anything else."""
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        value = value.item()
    return None if isinstance(value, bool) or not isinstance(value, numbers.Real) else value


def learn_locally(
    members: Sequence[Member], outcome: PlayOutcome, generation: int
) -> tuple[Losses, LearnerInfo, list[LearnerFailure]]:
    """Each evolving member's learner on its own transitions, in member order."""
    losses: Losses = {}
    infos: LearnerInfo = {}
    failures = []
    for member in members:
        if member.learner is None or not outcome.transitions.get(member.id):
            continue
        # a copy: get_genome may return views (the protocol allows it: a state_dict()), which an in-place
        # optimizer step changes, and the "undone" update was kept (a review)
        genome = {
            key: value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            for key, value in member.policy.get_genome().items()
        }  # (deepcopy refuses a tensor with autograd history: a clone of a parameter)
        learner_state = copy.deepcopy(member.learner.state_dict())
        try:
            stats = member.learner.update(member.policy, outcome.transitions[member.id])
            # a learner that diverged without raising: its weights would be checkpointed, and every resume
            # would replay into the same failure of play or of the operators
            check_finite(member.policy.get_genome(), f"member {member.id}'s genome after its update")
            losses[str(member.id)], info = learn_stats(stats, member.id, member.learner)
            if info:
                infos[str(member.id)] = info
        except Exception as error:  # any learner bug: undo, skip this member for the generation, keep the run
            member.policy.set_genome(genome)
            member.learner.reset()
            member.learner.load_state_dict(learner_state)
            failures.append(LearnerFailure(member.id, generation, type(error).__name__, str(error)))
    return losses, infos, failures


def _new_env(
    env_config: TeacherStudentConfig, table: RatingTable, pfsp: bool
) -> tuple[Any, Any, MemberMatchmaker]:
    from populora_env.verifier import Verifier, VerifierConfig

    verifier = Verifier(VerifierConfig())
    matchmaker = MemberMatchmaker(table, env_config.students_per_task, pfsp=pfsp)
    # a member's illegal action costs it the format penalty, and is logged (play_episodes): under "raise" one
    # member's bad action ended the whole run (a robustness review)
    env_config = dataclasses.replace(env_config, illegal_action="penalize")
    return (
        teacher_student_v0.env(config=env_config, verifier=verifier, matchmaker=matchmaker),
        verifier,
        matchmaker,
    )


class LocalBackend:
    """Plays episodes of ``TeacherStudent-v0`` in this process with a verifier it owns.

    Args:
        env_config: the game's config (seats, rounds, structured or text mode).
        table: ratings read by the PFSP matchmaker.
        pfsp: match students to tasks by PFSP on the members' ratings (else all-pairs).
    """

    def __init__(self, env_config: TeacherStudentConfig, table: RatingTable, pfsp: bool) -> None:
        self.env, self.verifier, self.matchmaker = _new_env(env_config, table, pfsp)

    def play(
        self,
        members: Sequence[Member],
        sampling_seeds: Mapping[int, int],
        seatings: Sequence[Mapping[str, int]],
        seeds: Sequence[int],
        buffer: Mapping[str, Any] | None = None,
    ) -> PlayOutcome:
        """Reseeds the members' samplers and plays the episodes here."""
        for member in members:
            if member.id in sampling_seeds:
                member.policy.reseed(sampling_seeds[member.id])
        policies = {m.id: m.policy for m in members}
        return play_episodes(self.env, self.matchmaker, policies, seatings, seeds, buffer)

    def learn(
        self, members: Sequence[Member], outcome: PlayOutcome, generation: int
    ) -> tuple[Losses, LearnerInfo, list[LearnerFailure]]:
        """``learn_locally``."""
        return learn_locally(members, outcome, generation)

    def close(self) -> None:
        """Closes the verifier."""
        self.env.close()
        self.verifier.close()


# ----- Ray ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemberSpec:
    """What an episode actor needs to rebuild a member's policy."""

    id: int
    role: str
    kind: str
    genome: dict[str, Any] | None
    sampling_seed: int | None


RAY_CONNECT_TIMEOUT = 10.0
"""Seconds ``RayBackend`` waits for a TCP connection to a ``host:port`` ``ray_address`` before giving up."""


def _unreachable(address: str | None, timeout: float = RAY_CONNECT_TIMEOUT) -> str | None:
    """Why nothing answers at a Ray address of the form ``host:port`` or ``ray://host:port`` (a TCP
    connection attempt), or None (it answers, or the address is ``None``/``"auto"``/``"local"``, which Ray
    resolves itself)."""
    import socket

    if address is None or ("://" in address and not address.startswith("ray://")):
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as error:
        return f"nothing answers at {host}:{port} (TCP, {timeout:g} s: {error})"


def _use_torch_threads(config: PBTConfig) -> None:
    """An actor's torch threads: ``config.torch_threads`` where set (``None``: Ray's one thread)."""
    if config.torch_threads is not None:
        import torch

        torch.set_num_threads(config.torch_threads)


class EpisodeWorker:
    """Ray actor body: owns an env and its verifier and plays a generation's episodes."""

    def __init__(self, config: PBTConfig) -> None:
        _use_torch_threads(config)
        self.config = config
        self.table = RatingTable()
        self.env, self.verifier, self.matchmaker = _new_env(config.env, self.table, config.pfsp)

    def play(
        self,
        specs: Sequence[MemberSpec],
        ratings: Mapping[int, tuple[float, float]],
        seatings: Sequence[Mapping[str, int]],
        seeds: Sequence[int],
        buffer: Mapping[str, Any] | None = None,
    ) -> PlayOutcome:
        """Rebuilds the members' policies from their genomes and seeds, then plays."""
        self.table.ratings = RatingTable.from_state(ratings).ratings
        policies: dict[int, Any] = {}
        for spec in specs:
            seed = spec.sampling_seed if spec.sampling_seed is not None else 0
            policy = POLICIES[spec.kind](self.env, spec.role, seed, self.config)
            if spec.genome is not None:
                policy.set_genome(spec.genome)
            if spec.sampling_seed is not None:
                policy.reseed(spec.sampling_seed)
            policies[spec.id] = policy
        return play_episodes(self.env, self.matchmaker, policies, seatings, seeds, buffer)

    def close(self) -> None:
        """Closes the verifier."""
        self.verifier.close()


class MemberWorker:
    """Ray actor body for one evolving member slot: runs the member's learner on its genome."""

    def __init__(self, config: PBTConfig, kind: str, role: str) -> None:
        _use_torch_threads(config)
        self.policy = POLICIES[kind](teacher_student_v0.raw_env(config=config.env), role, 0, config)
        self.learner = LEARNERS[config.learner_for(role)](self.policy, config.learner_config)

    def learn(
        self, member_id: int, genome: dict[str, Any], state: dict[str, Any], experience: Sequence[Transition]
    ) -> tuple[Any, ...]:
        """``("ok", genome, learner state, loss, info)`` or ``("error", type name, message)``; the messages
        are ``learn_locally``'s, word for word (metrics.jsonl is the same on both backends)."""
        try:
            self.policy.set_genome(genome)
            self.learner.reset()
            self.learner.load_state_dict(state)
            stats = self.learner.update(self.policy, experience)
            genome = self.policy.get_genome()
            check_finite(genome, f"member {member_id}'s genome after its update")
            loss, info = learn_stats(stats, member_id, self.learner)
        except Exception as error:  # reported to the coordinator, which keeps the member unchanged
            return ("error", type(error).__name__, str(error))
        return ("ok", genome, self.learner.state_dict(), loss, info)


CLOSE_TIMEOUT = 10.0
"""Seconds ``RayBackend.close`` waits for the episode actor to close its verifier before killing it."""


class RayBackend:
    """Members as plain Ray actors (an episode actor plus one learner actor per evolving slot).

    Args:
        config: the run's config (``ray_address``: ``None`` starts a local Ray instance).
        table: the coordinator's ratings (sent to the episode actor each generation for PFSP).
    """

    def __init__(self, config: PBTConfig, table: RatingTable) -> None:
        import ray

        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            unreachable = _unreachable(config.ray_address)
            if unreachable is not None:  # Ray itself retries for many minutes before it gives up
                raise RuntimeError(f"cannot join Ray at ray_address={config.ray_address!r}: {unreachable}")
            try:
                ray.init(address=config.ray_address, num_cpus=config.ray_num_cpus, include_dashboard=False,
                         log_to_driver=False, configure_logging=False)  # fmt: skip
            except (ConnectionError, SystemExit, TimeoutError) as error:  # Ray exits when no GCS answers
                ray.shutdown()
                raise RuntimeError(
                    f"cannot start or join Ray at ray_address={config.ray_address!r}: "
                    f"{type(error).__name__}: {error}"
                ) from None
        elif config.ray_address is not None or config.ray_num_cpus is not None:
            logger.warning("Ray is already initialised in this process: ray_address and ray_num_cpus are "
                           "ignored, its actors run on that instance")  # fmt: skip
        self.config = config
        self.table = table
        self.workers: dict[str, Any] = {}
        self.episodes: Any = None
        try:
            self.env = teacher_student_v0.raw_env(config=config.env)  # only to build scripted members here
            self.episodes = self._episode_actor()
        except BaseException:
            self.close()
            raise

    def _episode_actor(self) -> Any:
        # zero-CPU actors: scheduled regardless of their number; Ray's OS processes share the CPUs
        actor = self.ray.remote(num_cpus=0)(EpisodeWorker).remote(self.config)
        self._await_ready([actor])
        return actor

    def _await_ready(self, actors: Sequence[Any]) -> None:
        """With ``ray_timeout_s``, waits (without a limit) until new actors are constructed, so that their
        start-up (a process, imports, a base model loaded) is not counted in a call's time. An actor that
        died starting is left for its call to report."""
        if self.config.ray_timeout_s is None or not actors:
            return
        for ready in [actor.__ray_ready__.remote() for actor in actors]:
            with contextlib.suppress(self.ray.exceptions.RayActorError):
                self.ray.get(ready)

    def play(
        self,
        members: Sequence[Member],
        sampling_seeds: Mapping[int, int],
        seatings: Sequence[Mapping[str, int]],
        seeds: Sequence[int],
        buffer: Mapping[str, Any] | None = None,
    ) -> PlayOutcome:
        """Plays the generation on the episode actor. If its process dies (the OOM killer, a crash in native
        code), a fresh actor plays the generation again: episodes depend only on what is sent (genomes,
        seeds, ratings), so the outcome is the one the first actor would have returned. A second death in
        the same generation is a RuntimeError."""
        specs = [
            MemberSpec(
                m.id,
                m.role,
                m.kind,
                m.policy.get_genome() if m.evolves else None,
                sampling_seeds.get(m.id),
            )
            for m in members
        ]
        args = (specs, self.table.state(), list(seatings), list(seeds), buffer)
        lost = (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError)
        for retry in (False, True):
            try:
                return self.ray.get(self.episodes.play.remote(*args), timeout=self.config.ray_timeout_s)
            except lost as error:
                if getattr(error, "actor_init_failed", False):
                    raise _not_started("the Ray episode actor", error) from None
                what = self._lost(error)
                if retry:
                    twice = "died" if isinstance(error, self.ray.exceptions.RayActorError) else "was lost"
                    raise RuntimeError(
                        f"the Ray episode actor {twice} twice playing one generation (the second time it {what})"
                    ) from None
                logger.warning("the Ray episode actor %s; a fresh one plays the generation again", what)
                self._kill(self.episodes)
                self.episodes = None  # close() must not wait on the dead one if the next line raises
                self.episodes = self._episode_actor()
        raise AssertionError("unreachable")

    def _worker(self, member: Member) -> Any:
        if member.slot not in self.workers:
            actor = self.ray.remote(num_cpus=0)(MemberWorker)
            self.workers[member.slot] = actor.remote(self.config, member.kind, member.role)
        return self.workers[member.slot]

    def learn(
        self, members: Sequence[Member], outcome: PlayOutcome, generation: int
    ) -> tuple[Losses, LearnerInfo, list[LearnerFailure]]:
        """All learners at once on their actors; results applied in member order. A learner that raises,
        or whose actor's process dies, is reported and its member left as it was (as locally)."""
        todo = [m for m in members if m.learner is not None and outcome.transitions.get(m.id)]
        new = [m for m in todo if m.slot not in self.workers]
        self._await_ready([self._worker(m) for m in new])  # the deadline below counts the learning only
        pending = []
        for member in todo:
            assert member.learner is not None
            state = member.learner.state_dict()
            ref = self._worker(member).learn.remote(
                member.id, member.policy.get_genome(), state, outcome.transitions[member.id]
            )
            pending.append((member, ref))
        losses: Losses = {}
        infos: LearnerInfo = {}
        failures = []
        lost = (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError)
        deadline = None if self.config.ray_timeout_s is None else time.monotonic() + self.config.ray_timeout_s
        for member, ref in pending:
            try:  # the learners run at once: one deadline for them all
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                reply = self.ray.get(ref, timeout=left)
            except lost as error:  # its process died (os._exit, OOM killer), or it hung
                self._kill(self.workers.pop(member.slot, None))  # the next generation gets a fresh actor
                if getattr(error, "actor_init_failed", False):
                    raise _not_started(f"member {member.id}'s learner actor", error) from None
                message = f"the learner's Ray actor {self._lost(error)}"
                failures.append(LearnerFailure(member.id, generation, type(error).__name__, message))
                continue
            if reply[0] == "error":
                failures.append(LearnerFailure(member.id, generation, reply[1], reply[2]))
                continue
            _, genome, state, loss, info = reply
            member.policy.set_genome(genome)
            assert member.learner is not None
            member.learner.reset()
            member.learner.load_state_dict(state)
            losses[str(member.id)] = loss
            if info:
                infos[str(member.id)] = info
        return losses, infos, failures

    def _lost(self, error: BaseException) -> str:
        """How an actor was lost, for messages: it died, or it did not answer within ``ray_timeout_s``."""
        if isinstance(error, self.ray.exceptions.GetTimeoutError):
            return f"did not answer within ray_timeout_s={self.config.ray_timeout_s:g} s (killed)"
        return f"died: {_first_line(error)}"

    def _kill(self, actor: Any) -> None:
        """Kills ``actor`` (if any), whatever state it is in (dead already, hung)."""
        if actor is not None:
            with contextlib.suppress(Exception):
                self.ray.kill(actor)

    def close(self) -> None:
        """Stops the actors (and the Ray instance this backend started), whatever state they are in: the
        episode actor gets ``CLOSE_TIMEOUT`` seconds to close its verifier (a dead or hung actor none: it
        is killed), then every actor is killed and the instance shut down."""
        try:
            if self.episodes is not None:
                self.ray.get(self.episodes.close.remote(), timeout=CLOSE_TIMEOUT)
        except Exception as error:  # dead, hung (still playing) or unreachable: killed below all the same
            logger.warning("Ray episode actor did not close cleanly (%s); killing it", type(error).__name__)
        finally:
            for actor in [self.episodes, *self.workers.values()]:
                self._kill(actor)
            self.workers.clear()
            if self.started:
                self.ray.shutdown()


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the process names in its messages


def _first_line(error: BaseException) -> str:
    """The first line of a (multi-line, traceback-bearing) Ray error, cut to 200 characters."""
    lines = _ANSI.sub("", str(error)).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def _not_started(what: str, error: BaseException) -> RuntimeError:
    """The error for an actor whose constructor raised: that exception (the last line of Ray's traceback),
    not a death to retry every generation (a learner registered in the driver script only was reported as
    one for every member and generation, its cause cut off, and the run ended having learned nothing; an
    audit). The run stops; its last checkpoint stays as it was."""
    lines = [line.strip() for line in _ANSI.sub("", str(error)).splitlines() if line.strip()]
    cause = lines[-1][:300] if lines else type(error).__name__
    return RuntimeError(f"{what} could not start: {cause}")


def make_backend(config: PBTConfig, table: RatingTable) -> Backend:
    """Builds the backend named in the config (``local`` or ``ray``)."""
    if config.backend == "local":
        return LocalBackend(config.env, table, config.pfsp)
    if config.backend == "ray":
        return RayBackend(config, table)
    raise ValueError(f"backend must be 'local' or 'ray', got {config.backend!r}")
