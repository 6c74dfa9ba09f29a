"""The population's state (members, ratings, generators, history, lineage) and one generation's step."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, cast

import numpy as np
import torch

from evolve import operators
from evolve.genome import check_finite, lora_pairs
from evolve.learners import LEARNERS
from evolve.lineage import LineageRecord, MemberRole, operator_use
from evolve.members import POLICIES
from evolve.protocols import Learner, Transition, is_evolvable
from evolve.ratings import MatchResult, RatingTable
from evolve.runlog import GenerationMetrics, summarize_episodes, warn_once
from evolve.selection import CLONE, plan_replacements
from populora_env.tasks import TaskBuffer

if TYPE_CHECKING:
    from evolve.backends import Backend, PlayOutcome
    from evolve.pbt import PBTConfig

logger = logging.getLogger(__name__)
#: The built-in kinds with no genome (their members play as fixed ones)
FIXED_KINDS = ("scripted", "random")


def _takes(factory: Any, count: int) -> bool:
    """Whether ``factory`` can be called with ``count`` positional arguments (``True`` when its signature
    cannot be read: its own error is then shown as it is)."""
    try:
        inspect.signature(factory).bind(*range(count))
    except TypeError:
        return False
    except ValueError:  # (no signature: a built-in)
        return True
    return True


def _warn_if_unmoved(kind: str, mutation: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Logs, once a process for each kind and mutation, when the first such mutation left its child as it was:
    the mutations scale their noise to each tensor's spread, so a genome of scalars, one-element or constant
    tensors (hyper-parameters, a zero-initialised table) never moved while lineage.jsonl recorded a mutation
    (a review)."""
    if (kind, mutation) in _CHECKED_MUTATIONS:
        return
    _CHECKED_MUTATIONS.add((kind, mutation))
    # only a child the mutation did not change at all: single tensors are left alone by design elsewhere
    # (layer_gaussian's other layers, neftune_a's B, a fresh adapter's B = 0)
    floats = [
        key for key, value in before.items() if isinstance(value, torch.Tensor) and value.is_floating_point()
    ]
    if floats and all(torch.equal(before[key], after[key]) for key in floats):
        shown = ", ".join(repr(key) for key in floats[:4]) + (", ..." if len(floats) > 4 else "")
        logger.warning(
            "mutation %r left a %r child as it was (%s): its noise is scaled to each tensor's spread, and a "
            "scalar, one-element or constant tensor has none",
            mutation, kind, shown,
        )  # fmt: skip


_CHECKED_MUTATIONS: set[tuple[str, str]] = set()


def _check_operators_suit(config: PBTConfig, kind: str, genome: dict[str, Any]) -> None:
    """``ValueError`` before the first generation when a LoRA-only operator is configured for members whose
    genome holds no LoRA pair (a kind of the user's: PBTConfig checks the built-in ones; the error came after a
    whole generation, advising a lower mutation_strength; a review)."""
    lora_only = sorted(operators.LORA_ONLY & {*config.crossovers, *config.mutations})
    if lora_only and not lora_pairs(genome):
        raise ValueError(
            f"operators {lora_only} act on LoRA genomes only (PEFT's '...lora_A.weight'/'...lora_B.weight' "
            f"keys); {kind!r} members have a plain genome (keys {sorted(genome)[:3]}...): choose others"
        )


@dataclass
class Member:
    """A seat-independent participant: an id, a role, a policy and (if it evolves) a learner.

    Attributes:
        id: unique within the run (children get new ids).
        role: ``teacher``, ``student`` or ``both``.
        kind: a name in ``evolve.members.POLICIES`` (``torch``, ``scripted``, ``random``...).
        slot: ``<role>/<index>``: the place in the population it holds (children take their slot).
        policy: anything with ``act``; evolving members also have ``get_genome``/``set_genome``.
        learner: the member's learner (``None`` for fixed members).
    """

    id: int
    role: str
    kind: str
    slot: str
    policy: Any
    learner: Learner | None

    @property
    def evolves(self) -> bool:
        """Whether operators and a learner change this member."""
        return self.learner is not None


class Population:
    """Everything a checkpoint holds: members by role, ratings, the coordinator's generators, history."""

    def __init__(self, config: PBTConfig, table: RatingTable) -> None:
        self.config = config
        self.table = table
        self.generation = 0
        self.next_id = 0
        self.groups: dict[str, list[Member]] = {}
        # The coordinator's generators: numpy for seating, seeds and selection; torch for the operators.
        self.rng = np.random.default_rng(config.seed)
        self.torch_rng = torch.Generator().manual_seed(config.seed)
        self.history: list[dict[str, Any]] = []
        self.lineage: list[LineageRecord] = []
        # the env's task buffer between generations (``env.persist_buffer``), else None
        self.buffer: dict[str, Any] | None = None

    @classmethod
    def create(cls, config: PBTConfig, env: Any, table: RatingTable) -> Population:
        """The initial population (weights drawn from the run's seed)."""
        pop = cls(config, table)
        roles = (
            {"both": config.teachers}
            if config.self_play
            else {"teacher": config.teachers, "student": config.students}
        )
        for role, kind in roles.items():
            first = pop._new_member(role, kind, f"{role}/0", env)
            seats = config.env.n_teachers if role == "teacher" else config.env.n_students
            count = config.population if first.evolves else seats
            rest = [pop._new_member(role, kind, f"{role}/{i}", env) for i in range(1, count)]
            pop.groups[role] = [first, *rest]
            if first.evolves:
                _check_operators_suit(config, kind, first.policy.get_genome())
        return pop

    def _new_member(self, role: str, kind: str, slot: str, env: Any) -> Member:
        seed = int(self.rng.integers(2**31))
        member_id, self.next_id = self.next_id, self.next_id + 1
        self.lineage.append(LineageRecord(member_id, cast(MemberRole, role), -1, "initial"))
        factory = POLICIES[kind]
        try:
            policy = factory(env, role, seed, self.config)
        except TypeError as error:  # (a factory of another signature named neither the kind nor the rule)
            if _takes(factory, 4):
                raise
            raise TypeError(
                f"policy kind {kind!r}: its factory is called as factory(env, role, seed, config) "
                f"(evolve.members.POLICIES) and raised: {error}"
            ) from error
        if not hasattr(policy, "reseed"):
            warn_once(
                logger, ("no reseed", kind),
                "policy kind %r has no reseed(seed): if its policies draw random numbers, a resumed, extended "
                "or Ray run differs from an uninterrupted local one (their generators are not replayed)",
                kind,
            )  # fmt: skip
        if not is_evolvable(policy):
            if kind not in FIXED_KINDS:
                # (a kind of the user's lacking set_genome played as a fixed member: its learner never ran,
                # no operator touched it, its role shrank to its seats, and nothing said so; a review)
                missing = [n for n in ("get_genome", "set_genome") if not callable(getattr(policy, n, None))]
                warn_once(
                    logger, ("not evolvable", kind),
                    "policy kind %r has no %s: its members play as fixed ones (one per seat), with no learner "
                    "and no evolution; give its policies get_genome() and set_genome(genome) "
                    "(evolve.protocols.EvolvablePolicy) to evolve them",
                    kind, " or ".join(missing),
                )  # fmt: skip
            return Member(member_id, role, kind, slot, policy, None)
        name = self.config.learner_for(role)
        make_learner = LEARNERS[name]
        try:
            learner = make_learner(policy, self.config.learner_config)
        except TypeError as error:  # (the same for a learner's factory; its own checks' errors as they are)
            if _takes(make_learner, 2):
                raise
            raise TypeError(
                f"learner {name!r} for {role} members of kind {kind!r}: its factory is called as "
                f"factory(policy, learner_config) (evolve.learners.LEARNERS) and raised: {error}"
            ) from error
        return Member(member_id, role, kind, slot, policy, learner)

    def members(self) -> list[Member]:
        """All members, role by role."""
        return [m for group in self.groups.values() for m in group]

    # ----- checkpoint state ----------------------------------------------------------------------
    def state(self, fingerprint: dict[str, Any]) -> dict[str, Any]:
        """Plain containers for ``save_checkpoint``."""
        groups = {
            role: [
                {
                    "id": m.id,
                    "genome": m.policy.get_genome() if m.evolves else None,
                    "learner": copy.deepcopy(m.learner.state_dict()) if m.learner is not None else None,
                }
                for m in group
            ]
            for role, group in self.groups.items()
        }
        return {
            "config": json.dumps(fingerprint, sort_keys=True),
            "generation": self.generation,
            "next_id": self.next_id,
            "groups": groups,
            "ratings": json.dumps(self.table.state()),
            "rng": json.dumps(self.rng.bit_generator.state),
            "torch_rng": self.torch_rng.get_state(),
            "history": json.dumps(self.history),
            "lineage": json.dumps([r.to_json() for r in self.lineage]),
            "buffer": json.dumps(self.buffer),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Loads ``state()`` into a freshly created population of the same config.

        Raises:
            ValueError, KeyError, TypeError: a state this population cannot take (a field missing or of
                another kind, a member id given twice, a genome with non-finite values, ...); ``run_pbt``
                reports it as a ``CheckpointError`` naming the file.
        """
        self.generation = int(state["generation"])
        self.next_id = int(state["next_id"])
        history = _saved_json(state, "history")
        if not isinstance(history, list) or len(history) != self.generation:
            # (`[]` resumed and rewrote metrics.jsonl to the generations after it: a review)
            raise ValueError(
                f"checkpoint's history holds {len(history) if isinstance(history, list) else 'no list of'} "
                f"generations' records, its generation is {self.generation}"
            )
        if set(state["groups"]) != set(self.groups):
            raise ValueError(
                f"checkpoint has the roles {sorted(state['groups'])}, the config {sorted(self.groups)}"
            )
        ids: set[int] = set()
        for role, saved in state["groups"].items():
            group = self.groups[role]
            if len(saved) != len(group):
                raise ValueError(f"checkpoint has {len(saved)} {role} members, the config {len(group)}")
            for member, entry in zip(group, saved, strict=True):
                member.id = int(entry["id"])
                if member.id in ids:
                    raise ValueError(f"checkpoint gives member id {member.id} twice")
                ids.add(member.id)
                if member.learner is not None:
                    # a genome edited to NaN loaded and played (a robustness review), one of int64 was cast
                    check_finite(entry["genome"], f"{role} member {member.id}'s genome")
                    _check_dtypes(entry["genome"], member.policy.get_genome(), f"{role} member {member.id}")
                    member.policy.set_genome(entry["genome"])
                    member.learner.reset()
                    member.learner.load_state_dict(entry["learner"])
        ratings = {int(k): tuple(v) for k, v in _saved_json(state, "ratings").items()}
        if bad := [k for k, (_mu, sigma) in ratings.items() if not sigma > 0]:
            raise ValueError(f"checkpoint's rating of member {bad[0]} has sigma {ratings[bad[0]][1]!r}")
        self.table.ratings = RatingTable.from_state(ratings).ratings
        self.rng.bit_generator.state = json.loads(state["rng"])
        self.torch_rng.set_state(state["torch_rng"])
        self.history = history
        self.lineage = [LineageRecord.from_json(r) for r in _saved_json(state, "lineage")]
        self.buffer = _saved_json(state, "buffer") if "buffer" in state else None  # (none before 2026-12-03)
        if (self.buffer is not None) != (self.config.env.persist_buffer and self.generation > 0):
            raise ValueError(
                f"checkpoint {'holds' if self.buffer is not None else 'has no'} task buffer, its config has "
                f"persist_buffer {self.config.env.persist_buffer}"
            )
        if self.buffer is not None:  # (checked now: a bad one would fail at the next play)
            capacity = TaskBuffer.from_state(self.buffer).capacity
            if capacity != self.config.env.buffer_capacity:
                raise ValueError(
                    f"checkpoint's task buffer has capacity {capacity}, the config {self.config.env.buffer_capacity}"
                )
        if (seen := max([*ids, *(r.member for r in self.lineage)], default=-1)) >= self.next_id:
            # (0 gave the next children the ids of the first members: lineage.jsonl ambiguous, a review)
            raise ValueError(
                f"checkpoint's next member id is {self.next_id}, but member {seen} exists already"
            )


def _saved_json(state: Mapping[str, Any], field: str) -> Any:
    """A JSON field of a checkpoint, refusing NaN and infinities (a run writes none: edited, they resumed and
    wrote NaN into metrics.jsonl, which is no JSON, a review)."""

    def refuse(constant: str) -> NoReturn:
        raise ValueError(f"checkpoint's {field} holds {constant}, which no run writes")

    def finite(text: str) -> float:
        value = float(text)
        return value if math.isfinite(value) else refuse(text)

    return json.loads(state[field], parse_constant=refuse, parse_float=finite)


def _check_dtypes(saved: Mapping[str, Any], own: Mapping[str, torch.Tensor], member: str) -> None:
    """``ValueError`` naming the first tensor of a saved genome whose dtype is not the member's own."""
    for key, value in saved.items():
        if key in own and isinstance(value, torch.Tensor) and value.dtype != own[key].dtype:
            raise ValueError(f"{member}'s genome holds {key!r} as {value.dtype}, the member {own[key].dtype}")


# ----- one generation ---------------------------------------------------------------------------------
def seatings(pop: Population, episodes: int) -> list[dict[str, int]]:
    """Who sits where in each episode: a fresh permutation per role, cycled so every member plays."""
    cfg = pop.config.env
    out: list[dict[str, int]] = [{} for _ in range(episodes)]
    for role, group in pop.groups.items():
        order = [group[int(i)] for i in pop.rng.permutation(len(group))]
        seats = cfg.n_teachers if role == "teacher" else cfg.n_students
        for e in range(episodes):
            for k in range(seats):
                member = order[(e * seats + k) % len(order)]
                for prefix in ("teacher", "student") if role == "both" else (role,):
                    out[e][f"{prefix}_{k}"] = member.id
    return out


def _role_fitness(
    role: str, member: int, transitions: Sequence[Transition], results: Sequence[MatchResult]
) -> float | None:
    if role == "student":
        attempts = [r.solved for r in results if r.student == member]
        return sum(attempts) / len(attempts) if attempts else None
    rewards = [t.reward for t in transitions if t.role == "teacher"]
    return sum(rewards) / len(rewards) if rewards else None


def fitness_of(pop: Population, member: Member, outcome: PlayOutcome) -> float | None:
    """Student: solve rate of its attempts; teacher: mean reward per proposal (AZR's learnability);
    self-play member: their sum; or the OpenSkill ordinal when ``fitness="rating"``.

    ``None`` when the generation did not evaluate the member: a student that attempted nothing (PFSP
    matchmaking gave it no task, or every task of its episodes was invalid), a teacher that proposed
    nothing. Such a member is neither replaced nor a parent that generation (it scored 0.0 before, tied
    with a member that failed everything, and a child could be retired before it had played)."""
    transitions = outcome.transitions.get(member.id, [])
    roles = ("teacher", "student") if member.role == "both" else (member.role,)
    values = [
        v for v in (_role_fitness(r, member.id, transitions, outcome.results) for r in roles) if v is not None
    ]
    if not values:  # also with fitness="rating": an unplayed child's fresh sigma ranked it near the bottom
        return None
    return pop.table.get(member.id).ordinal if pop.config.fitness == "rating" else sum(values)


def _replace(pop: Population, role: str, fitness: list[float | None], generation: int) -> list[LineageRecord]:
    cfg = pop.config
    group = pop.groups[role]
    evaluated = [i for i, f in enumerate(fitness) if f is not None]  # the others sit this selection out
    planned = plan_replacements(
        [fitness[i] for i in evaluated], replace_fraction=cfg.replace_fraction, n_elites=cfg.n_elites,  # type: ignore[misc]
        tournament_size=cfg.tournament_size, n_parents=cfg.n_parents, crossovers=cfg.crossovers,
        mutations=cfg.mutations, rng=pop.rng, of=len(group),
    )  # fmt: skip
    plan = [
        dataclasses.replace(
            step, slot=evaluated[step.slot], parents=tuple(evaluated[p] for p in step.parents)
        )
        for step in planned
    ]
    children = []
    for step in plan:  # all children from the pre-replacement genomes (top and bottom are disjoint)
        parents = [group[p].policy.get_genome() for p in step.parents]
        if step.crossover == CLONE:
            child = {key: value.clone() for key, value in parents[0].items()}
        else:
            child = operators.CROSSOVERS[step.crossover](
                parents,
                rng=pop.torch_rng,
                fitness=[fitness[p] for p in step.parents],
            )
        try:
            unmutated = child
            child = operators.MUTATIONS[step.mutation](
                child, rng=pop.torch_rng, strength=cfg.mutation_strength
            )
            if cfg.mutation_strength > 0:  # (at 0 an unmoved child is what was asked for)
                _warn_if_unmoved(group[step.slot].kind, step.mutation, unmutated, child)
        except ValueError as error:  # (1e300 overflowed the child, naming no setting: a review)
            if "overflow" not in str(error):  # (not the strength's doing: no advice to lower it)
                raise ValueError(f"generation {generation}: mutation {step.mutation!r}: {error}") from error
            raise ValueError(
                f"generation {generation}: mutation {step.mutation!r} at mutation_strength "
                f"{cfg.mutation_strength:g} made no {role} child ({error}); lower mutation_strength"
            ) from error
        children.append((step, child))
    records = []
    for step, child in children:
        member = group[step.slot]
        old_id, member.id = member.id, pop.next_id
        pop.next_id += 1
        member.policy.set_genome(child)
        assert member.learner is not None
        member.learner.reset()
        pop.table.forget(old_id)
        pop.table.inherit(member.id, group[step.parents[0]].id)
        parent_ids = tuple(group[p].id for p in step.parents)
        records.append(
            LineageRecord(
                member.id,
                cast(MemberRole, role),
                generation,
                "offspring",
                parent_ids,
                step.crossover,
                step.mutation,
                old_id,
            )
        )
    return records


def replace_weakest(
    pop: Population, fitness: Mapping[int, float | None], generation: int
) -> list[LineageRecord]:
    """Select and replace in every evolving role from the generation's fitness (by member id); the new
    members' lineage records are added to ``pop.lineage`` and returned."""
    children: list[LineageRecord] = []
    for role, group in pop.groups.items():
        if group and group[0].evolves:
            children += _replace(pop, role, [fitness[m.id] for m in group], generation)
    pop.lineage += children
    return children


def extend(pop: Population, saved_generations: int) -> bool:
    """Prepares a restored population for more generations than its run was configured for.

    The last generation of a run skips selection and replacement (its children would never play), so a
    run that finished ``saved_generations`` first does that generation's replacement now, from its
    recorded fitness and with the generators as the checkpoint left them (exactly where an uninterrupted
    longer run draws them), and adds the children to that generation's record. A run stopped earlier
    needs nothing: it had replaced after every generation it played.

    Returns:
        Whether the last record of ``pop.history`` was amended.
    """
    if pop.generation != saved_generations or not pop.history:
        return False
    record = pop.history[-1]
    children = replace_weakest(pop, {int(k): v for k, v in record["fitness"].items()}, pop.generation - 1)
    record["operator_use"] = operator_use(children)
    record["lineage"] = [r.to_json() for r in children]
    return True


def run_generation(
    pop: Population, backend: Backend, config: PBTConfig, generation: int
) -> GenerationMetrics:
    """Play, learn, rate, select and replace; returns the generation's metrics (measured before replacement)."""
    # ----- play --------------------------------------------------------------------------------------
    seats = seatings(pop, config.episodes_per_generation)
    seeds = [int(s) for s in pop.rng.integers(2**31, size=config.episodes_per_generation)]
    sampling_seeds = {
        m.id: int(pop.rng.integers(2**31)) for m in pop.members() if hasattr(m.policy, "reseed")
    }
    outcome = backend.play(pop.members(), sampling_seeds, seats, seeds, pop.buffer)
    pop.buffer = outcome.buffer
    # ----- learn, rate ---------------------------------------------------------------------------------
    losses, learner_info, failures = backend.learn(pop.members(), outcome, generation)
    pop.table.update(outcome.results)
    fitness = {m.id: fitness_of(pop, m, outcome) for m in pop.members()}
    role_fitness = {}
    for role, group in pop.groups.items():
        values = [v for v in (fitness[m.id] for m in group) if v is not None]  # members that were evaluated
        if values:
            role_fitness[role] = {"mean": sum(values) / len(values), "max": max(values)}
    ratings = {
        str(m.id): {"mu": pop.table.get(m.id).mu, "sigma": pop.table.get(m.id).sigma} for m in pop.members()
    }
    rewards: dict[str, list[float]] = {}
    for transitions in outcome.transitions.values():
        for t in transitions:
            rewards.setdefault(t.role, []).append(t.reward)
    # ----- select and replace (not after the last generation: its children would never play) ---------------
    children: list[LineageRecord] = []
    if generation + 1 < config.generations:
        children = replace_weakest(pop, fitness, generation)
    record = GenerationMetrics(
        generation=generation,
        fitness={str(k): v for k, v in fitness.items()},
        role_fitness=role_fitness,
        ratings=ratings,
        mean_reward={role: sum(v) / len(v) for role, v in sorted(rewards.items())},
        losses=losses,
        learner_failures=[f.__dict__ for f in failures],
        operator_use=operator_use(children),
        lineage=[r.to_json() for r in children],
        illegal_actions={str(m): n for m, n in sorted(outcome.illegal.items())},
        learner_info=learner_info,
        **summarize_episodes(outcome.metrics),
    )
    pop.history.append(record.to_json())
    pop.generation = generation + 1
    return record
