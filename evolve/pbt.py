"""``run_pbt``: population-based training around any policy that speaks the env API.

Each generation: play matches through the env -> each member's own learner updates it -> rate (OpenSkill)
-> replace the bottom fraction by crossover and mutation of the top (operator registries) -> checkpoint
(atomic, exact resume) -> log (JSONL, TensorBoard). Baselines are configs of the same loop:
``self_play=True`` with one member and a 1x1 game is AZR's single-agent self-play; ``population=1`` with
a 1x1 game is 1T-1S; larger games and populations are NTxNS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import logging
import marshal
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from evolve import operators
from evolve.backends import make_backend
from evolve.checkpoint import (
    DELETE_IT,
    CheckpointError,
    atomic_write_bytes,
    list_checkpoints,
    load_latest,
    prune_checkpoints,
    remove_temp_files,
    save_checkpoint,
)
from evolve.genome import torch_threads
from evolve.learners import LEARNERS, LearnerConfig
from evolve.members import POLICIES, NetConfig, is_finite_number, is_int_at_least
from evolve.population import FIXED_KINDS, Population, extend, run_generation
from evolve.ratings import RatingTable
from evolve.runlog import GenerationMetrics, RunLog, truncated_shares, warn_once
from evolve.selection import share_of
from populora_env.game import TeacherStudentConfig, warn_constant_teacher_reward
from populora_env.progress import watched

logger = logging.getLogger(__name__)

KIND_MODES = {"torch": "structured", "sb3": "structured", "lora": "text"}
"""The env mode each member kind plays (``PBTConfig`` refuses a game of the other mode before any member is
made); a plug-in kind that plays one mode only declares it here: ``KIND_MODES["mine"] = "structured"``."""
PLAIN_GENOME_KINDS = ("torch", "sb3")
"""Built-in kinds whose genome is a plain parameter dict (``operators.LORA_ONLY`` cannot act on it)."""
_NOT_RESULTS = ("run_dir", "progress", "tensorboard", "checkpoint_every", "keep_checkpoints", "backend",
                "ray_address", "ray_num_cpus", "ray_timeout_s")  # fmt: skip
"""Fields that change where and how often a run is written or shown, where it runs, or how long it waits
for a hung Ray actor, not its results."""
_INT_MINIMUMS = {
    "generations": 1, "population": 1, "episodes_per_generation": 1, "tournament_size": 1, "n_parents": 1,
    "checkpoint_every": 1, "keep_checkpoints": 1, "seed": 0, "n_elites": 0,
}  # fmt: skip
"""Integer fields and their least values (``population`` before the episodes derived from it)."""
_NUMBER_RANGES = {
    "replace_fraction": (0.0, 0.5),
    "scripted_strength": (0.0, 1.0),
    "mutation_strength": (0.0, math.inf),
}
"""Real fields and their closed ranges (finite values only)."""


def _structured_default() -> TeacherStudentConfig:
    return TeacherStudentConfig(mode="structured", n_teachers=2, n_students=2, rounds=1, n_slots=3)


@dataclass(frozen=True)
class PBTConfig:
    """A PBT run (validated on construction; operator and learner names are looked up in their registries)."""

    run_dir: str
    """Folder of the run: checkpoints, ``metrics.jsonl``, ``lineage.jsonl``, ``tb/``. An existing run there
    with the same config is resumed from its last checkpoint."""
    seed: int = 0
    """Seed of everything random in the run."""
    generations: int = 10
    """Generations to run. Raising it and running again on the same ``run_dir`` extends a run (finished
    or not) to exactly what an uninterrupted run of that length gives; it cannot be lowered."""
    episodes_per_generation: int = 4
    """Episodes played per generation."""
    env: TeacherStudentConfig = field(default_factory=_structured_default)
    """The game (structured mode for torch members); its ``n_teachers``/``n_students`` are the seats. Played with
    ``illegal_action="penalize"`` whatever it says: a member's illegal action pays the format penalty and is
    logged by member, where ``"raise"`` would end the run."""
    teachers: str = "torch"
    """Teacher members, a kind in ``evolve.members.POLICIES``: evolving ``torch`` policies, fixed
    ``scripted``/``random`` ones (one per seat), ``lora`` (LoRA adapters on one shared base, text mode,
    ``learner="grpo"``), ``sb3`` (SB3 PPO / MaskablePPO, structured mode, ``learner="ppo"``), or any
    registered kind; ``lora`` and ``sb3`` are imported on first use."""
    students: str = "torch"
    """Student members, as ``teachers``."""
    population: int = 4
    """Evolving members per role (per shared pool with ``self_play``); at least the seats of that role."""
    self_play: bool = False
    """Members play both roles: member ``k`` of an episode sits in ``teacher_k`` and ``student_k``."""
    scripted_strength: float = 0.3
    """Difficulty of scripted teachers / skill of scripted students."""
    pfsp: bool = False
    """Match students to tasks by PFSP on OpenSkill ratings (``env.students_per_task`` each)."""
    learner: str = "reinforce"
    """Members' learner, a name in ``evolve.learners.LEARNERS`` (``reinforce``, ``none``, or a registered
    one such as ``grpo`` for ``lora`` members)."""
    learners: dict[str, str] = field(default_factory=dict)
    """Per-role learners overriding ``learner``: keys ``teacher`` and ``student`` (``both`` with
    ``self_play``), e.g. ``{"student": "ppo"}`` for ``torch`` teachers and ``sb3`` students."""
    learner_config: LearnerConfig = field(default_factory=LearnerConfig)
    """The ``reinforce`` learner's hyper-parameters (``ppo`` reads its ``lr``); the ``grpo`` learner takes its
    own from ``member_options["grpo"]`` and needs this left at its default."""
    net: NetConfig = field(default_factory=NetConfig)
    """Torch members' layer sizes."""
    member_options: dict[str, Any] = field(default_factory=dict)
    """Options of other member kinds and their learners (JSON values; e.g. a LoRA kind's base model and
    rank), read by their factories from the config. Part of the run's fingerprint."""
    fitness: Literal["reward", "rating"] = "reward"
    """``reward``: student solve rate, teacher mean reward per proposal (their sum for self-play members);
    ``rating``: the OpenSkill ordinal ``mu - 3 sigma``."""
    replace_fraction: float = 0.25
    """Fraction of each evolving role replaced every generation (truncation selection)."""
    n_elites: int = 1
    """Best members never replaced."""
    tournament_size: int = 2
    """Entrants per parent tournament (drawn from the top fraction)."""
    n_parents: int = 2
    """Parents per child. With 1, every child is a clone of its parent, then mutated (``crossovers`` unused)."""
    crossovers: tuple[str, ...] = ("interpolate", "uniform", "dare", "es")
    """Crossover names in ``operators.CROSSOVERS`` (one drawn per child). ``clone_mutate`` mutates at its own
    defaults (``gaussian``, 0.05) before the child's drawn mutation at ``mutation_strength``."""
    mutations: tuple[str, ...] = ("gaussian", "layer_gaussian")
    """Mutation names in ``operators.MUTATIONS`` (one drawn per child)."""
    mutation_strength: float = 0.05
    """Mutation strength (noise std relative to each tensor's spread)."""
    checkpoint_every: int = 1
    """Checkpoint every this many generations (and after the last)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk."""
    backend: Literal["local", "ray"] = "local"
    """Where matches are played and members learn: this process, or Ray actors (same results)."""
    ray_address: str | None = None
    """Ray cluster to join (``"auto"``, ``"ray://<head>:10001"``); ``None`` starts a local instance."""
    ray_num_cpus: int | None = None
    """CPUs of a local Ray instance (``None``: all)."""
    ray_timeout_s: float | None = None
    """Seconds a generation's Ray calls may take before an actor that has not answered is taken for hung
    and killed: the episodes (one call), and the learners (running at once, one deadline for all of them).
    Counted from when the actors are ready (starting one, e.g. loading a base model, is not counted). A
    hung episode actor is replaced and the generation played again (a second hang is a ``RuntimeError``);
    a hung learner is reported and its member skipped, as for an actor that died. ``None`` waits for ever
    (a hung actor, e.g. on a lost node, then hangs the run)."""
    torch_threads: int | None = None
    """Torch intra-op threads for the members' play and learning, in this process (while ``run_pbt`` runs)
    and in every Ray actor. ``None`` leaves each process its count: this process's
    (``torch.get_num_threads()``) on the local backend, the actors' own on Ray (one, from Ray's
    ``OMP_NUM_THREADS=1``, or the machine's where torch was imported first, e.g. by a set-up hook). Some
    updates round differently under other counts (SB3's PPO, SB3's orthogonal initialisation; the small
    ``torch`` nets do not), so a Ray run equals the local one only when both use the same count: set it
    for such members (1 suits Ray, where the learners run at once, an actor each). Part of the run's
    fingerprint when set."""
    progress: bool = True
    """Report progress on standard error: a line per generation, under a tqdm bar where standard error is a
    terminal or a notebook (:func:`populora_env.progress.watched`)."""
    tensorboard: bool = True
    """Write TensorBoard scalars under ``run_dir/tb``."""

    def __post_init__(self) -> None:
        nested: tuple[tuple[str, type], ...] = (
            ("env", TeacherStudentConfig),
            ("learner_config", LearnerConfig),
            ("net", NetConfig),
        )
        for field_name, config_type in nested:  # a dict read from JSON would fail deep in the run
            if not isinstance(getattr(self, field_name), config_type):
                raise ValueError(
                    f"{field_name} must be a {config_type.__name__}, "
                    f"got {type(getattr(self, field_name)).__name__}"
                )
        # a path: "" was the current folder, None failed in pathlib once the run started (a robustness review)
        if not isinstance(self.run_dir, str | os.PathLike) or not os.fspath(self.run_dir):
            raise ValueError(f"run_dir must be a non-empty path, got {self.run_dir!r}")
        for name in ("self_play", "pfsp", "progress", "tensorboard"):  # "no" was true
            value = getattr(self, name)
            if not isinstance(value, bool | np.bool_):
                raise ValueError(f"{name} must be a bool, got {value!r}")
            object.__setattr__(self, name, bool(value))
        # numpy's ints and floats are accepted and stored as Python's (the config is written as JSON)
        for name, least in _INT_MINIMUMS.items():
            if not is_int_at_least(getattr(self, name), least):
                raise ValueError(f"{name} must be an int >= {least}, got {getattr(self, name)!r}")
            object.__setattr__(self, name, int(getattr(self, name)))
        if self.seed >= 2**63:  # (torch's generators take a signed 64-bit seed)
            raise ValueError(f"seed must be < 2**63, got {self.seed}")
        if 1 < self.population <= self.n_elites:  # (a population of one has no one to replace anyway)
            raise ValueError(
                f"n_elites must be < population ({self.population}): with {self.n_elites} no member would ever "
                "be replaced"
            )
        for name, (low, high) in _NUMBER_RANGES.items():
            value = getattr(self, name)
            if not (is_finite_number(value) and low <= value <= high):
                raise ValueError(f"{name} must be finite and in [{low}, {high}], got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.fitness not in ("reward", "rating"):
            raise ValueError(f"fitness must be 'reward' or 'rating', got {self.fitness!r}")
        for name in ("teachers", "students"):
            POLICIES[getattr(self, name)]  # KeyError listing the registered kinds
        for kind in (self.teachers, self.students):
            mode = KIND_MODES.get(kind)
            if mode not in (None, "text", "structured"):
                raise ValueError(f"KIND_MODES[{kind!r}] must be 'text' or 'structured', got {mode!r}")
            if mode is not None and self.env.mode != mode:
                raise ValueError(f"env.mode must be {mode!r} for {kind} members, got {self.env.mode!r}")
        if self.self_play:
            if self.teachers != self.students or self.teachers in FIXED_KINDS:
                raise ValueError("self_play needs one evolving kind for teachers and students (e.g. 'torch')")
            if self.env.n_teachers != self.env.n_students:
                raise ValueError("self_play needs env.n_teachers == env.n_students")
        evolving = [n for n, kind in ((self.env.n_teachers, self.teachers), (self.env.n_students, self.students))
                    if kind not in FIXED_KINDS]  # fmt: skip
        if evolving and self.population < max(evolving):
            raise ValueError(
                f"population must be >= the seats of an evolving role ({max(evolving)}), got {self.population}"
            )
        if evolving and self.episodes_per_generation * min(evolving) < self.population:
            raise ValueError(
                f"episodes_per_generation * seats ({self.episodes_per_generation} * {min(evolving)}) must be >= "
                f"population ({self.population}) so every member of each evolving role plays each generation"
            )
        for name in ("crossovers", "mutations"):
            names = getattr(self, name)
            if not isinstance(names, tuple | list) or not names or not all(isinstance(n, str) for n in names):
                raise ValueError(f"{name} must be a non-empty tuple of operator names, got {names!r}")
        plain = sorted({kind for kind in (self.teachers, self.students) if kind in PLAIN_GENOME_KINDS})
        if plain and (lora_only := sorted(operators.LORA_ONLY & {*self.crossovers, *self.mutations})):
            raise ValueError(
                f"operators {lora_only} act on LoRA genomes only; {plain} members have plain genomes"
            )
        if "component_mask" in self.mutations and self.mutation_strength > 1:
            raise ValueError(
                "mutation_strength is component_mask's drop probability and must be <= 1, got "
                f"{self.mutation_strength}"
            )
        for name in self.crossovers:
            operators.CROSSOVERS[name]  # KeyError listing the registry
        # (with one parent every child is a clone, then mutated: the crossovers are not used; an audit)
        if self.n_parents > 2 and (two := sorted(operators.TWO_PARENTS & set(self.crossovers))):
            raise ValueError(
                f"n_parents must be 2 with the crossovers {two} (they take exactly two parents), got "
                f"{self.n_parents}"
            )
        for name in self.mutations:
            operators.MUTATIONS[name]
        LEARNERS[self.learner]
        roles = ("both",) if self.self_play else ("teacher", "student")
        if not isinstance(self.learners, dict) or not set(self.learners) <= set(roles):
            raise ValueError(f"learners: keys must be among {list(roles)}, got {self.learners!r}")
        for name in self.learners.values():
            LEARNERS[name]
        if not isinstance(self.member_options, dict) or not all(
            isinstance(k, str) for k in self.member_options
        ):
            raise ValueError(f"member_options must be a dict with str keys, got {self.member_options!r}")
        try:
            json.dumps(self.member_options, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"member_options must hold JSON values only: {e}") from None
        if self.backend not in ("local", "ray"):
            raise ValueError(f"backend must be 'local' or 'ray', got {self.backend!r}")
        if self.ray_num_cpus is not None and not is_int_at_least(self.ray_num_cpus, 1):
            raise ValueError(f"ray_num_cpus must be None or an int >= 1, got {self.ray_num_cpus!r}")
        if self.ray_num_cpus is not None:
            object.__setattr__(self, "ray_num_cpus", int(self.ray_num_cpus))
        if self.ray_timeout_s is not None:
            if not (is_finite_number(self.ray_timeout_s) and self.ray_timeout_s > 0):
                raise ValueError(
                    f"ray_timeout_s must be None or a finite number > 0, got {self.ray_timeout_s!r}"
                )
            object.__setattr__(self, "ray_timeout_s", float(self.ray_timeout_s))
        if self.torch_threads is not None:
            if not is_int_at_least(self.torch_threads, 1):
                raise ValueError(f"torch_threads must be None or an int >= 1, got {self.torch_threads!r}")
            object.__setattr__(self, "torch_threads", int(self.torch_threads))
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address):
            raise ValueError(f"ray_address must be None or a non-empty string, got {self.ray_address!r}")
        if self.ray_address is not None and self.ray_num_cpus is not None:  # (Ray's own error named neither)
            raise ValueError(
                "ray_num_cpus sets the CPUs of a local Ray instance; a cluster at ray_address has its own: "
                "give one of them"
            )
        if self.backend == "ray" and importlib.util.find_spec("ray") is None:
            raise ValueError("backend='ray' needs Ray: pip install 'populora-env[ray]'")
        replaced = share_of(self.replace_fraction, self.population)  # (what selection.truncation replaces)
        if evolving and self.population > 1 and self.replace_fraction > 0 and replaced == 0:
            # (a population of 2 or 3 at the default 0.25 evolved nothing, and nothing said so: a review)
            message = (
                f"PBTConfig: replace_fraction {self.replace_fraction:g} of a population of {self.population} "
                f"replaces no member (floor({self.replace_fraction:g} * {self.population}) = 0): no member will "
                f"evolve; set replace_fraction >= {math.ceil(100 / self.population) / 100:.2f} to replace one "
                "per generation"
            )
            warn_once(logger, message, "%s", message)
        if self.teachers not in FIXED_KINDS:  # evolving teachers learn from, and are selected by, rewards
            # run_pbt's matchmaker: PFSP with `pfsp`, else every student attempts every task
            warn_constant_teacher_reward(self.env, "PBTConfig", "pfsp" if self.pfsp else "all_pairs")

    def learner_for(self, role: str) -> str:
        """The learner of a role's members (``teacher``, ``student`` or ``both``)."""
        return self.learners.get(role, self.learner)

    def fingerprint(self) -> dict[str, Any]:
        """The fields that define the run's results (not where it is written or how it is shown)."""
        data = dataclasses.asdict(self)
        for name in ("learners", "torch_threads"):  # left out unset: runs made before these fields existed
            if not data[name]:  # stay resumable
                data.pop(name)
        for key in _NOT_RESULTS:
            data.pop(key)
        return json.loads(json.dumps(data, default=_stable_description))


def _stable_description(value: Any) -> str:
    """A description of a non-JSON config value that is the same in every process (a resumed run compares
    it with the checkpoint's): a function by its qualified name and a hash of its code, defaults and
    closure values (``repr`` would show its memory address); other objects by their ``repr``, which must
    then not show an address."""
    code = getattr(value, "__code__", None)
    if code is None:
        return repr(value)
    cells = tuple(cell.cell_contents for cell in value.__closure__ or ())
    digest = hashlib.sha256(marshal.dumps(code) + repr((value.__defaults__, cells)).encode()).hexdigest()
    return f"<function {value.__module__}.{value.__qualname__} sha256:{digest[:16]}>"


def _differences(old: dict[str, Any], config: PBTConfig) -> str:
    """Where a saved fingerprint differs from ``config``'s, ``generations`` aside (it may grow): ``""`` when
    it does not, else ``"fields ['seed'] differ: seed: saved 3, now 4"`` down to the nested values (a base
    model's path in ``member_options`` is a typical one), at most three of them."""
    new = config.fingerprint()
    ignored = {"generations", *_NOT_RESULTS}  # checkpoints before 2026-12-01 hold checkpoint_every
    fields = sorted(k for k in set(old) | set(new) if k not in ignored and old.get(k) != new.get(k))
    if not fields:
        return ""
    leaves = [leaf for k in fields for leaf in _leaf_differences(k, old.get(k), new.get(k))]
    more = f" (and {len(leaves) - 3} more)" if len(leaves) > 3 else ""
    return f"fields {fields} differ: " + "; ".join(leaves[:3]) + more


def _leaf_differences(path: str, saved: Any, now: Any) -> list[str]:
    if isinstance(saved, dict) and isinstance(now, dict):
        keys = sorted(set(saved) | set(now), key=str)
        return [
            d
            for k in keys
            if saved.get(k) != now.get(k)
            for d in _leaf_differences(f"{path}.{k}", saved.get(k), now.get(k))
        ]
    return [f"{path}: saved {_short(saved)}, now {_short(now)}"]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_unsaved_start(run_dir: Path, config: PBTConfig) -> None:
    """A run folder with a ``config.json`` but no checkpoint holds the start of a run killed before its
    first checkpoint: the same run starts over; another one would silently replace its config and
    metrics, so it is refused."""
    path = run_dir / "config.json"
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(
            f"{path} is not a run config ({error}): delete that folder or choose another run_dir"
        ) from None
    if not isinstance(old, dict):
        raise ValueError(
            f"{path} is not a run config (a JSON {type(old).__name__}): delete that folder or choose another "
            "run_dir"
        )
    if differ := _differences(old, config):
        raise ValueError(
            f"{config.run_dir} holds the start of a run with another config ({differ}) and no checkpoint "
            "yet: delete that folder or choose another run_dir"
        )


def _check_same_run(saved: dict[str, Any], config: PBTConfig, path: Path) -> int:
    """Checks that ``config`` continues the saved run (read from ``path``); returns the generations that run
    was configured for.

    ``generations`` may be raised (the run is extended) but not lowered; every other field must match.
    """
    try:
        old = json.loads(saved["config"])
        if not isinstance(old, dict):
            raise TypeError(f"a JSON {type(old).__name__}")
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"{path}: holds no run config ({type(error).__name__}: {error}); {DELETE_IT}"
        ) from None
    saved_generations = int(old.get("generations", config.generations))
    if differ := _differences(old, config):
        raise ValueError(f"{config.run_dir} holds a run with another config ({differ})")
    if config.generations < saved_generations:
        raise ValueError(
            f"generations: {config.run_dir} holds a run of {saved_generations} generations; a run can be "
            f"extended (generations >= {saved_generations}), not shortened (got {config.generations})"
        )
    return saved_generations


RUN_FILES = ("config.json", "metrics.jsonl", "lineage.jsonl")
"""The files ``run_pbt`` writes atomically in the run folder (besides ``checkpoints/`` and ``tb/``)."""
OVERWRITTEN = ("metrics.jsonl", "lineage.jsonl", "tb", "curves.png")
"""What a new run replaces or adds to in its folder (``curves.png``: ``populora train``'s plot), refused
in a folder that holds them without a run's config or checkpoint."""


def _say(bar: Any, text: str) -> None:
    """One line of the run's progress on standard error (standard output stays the caller's), above the bar
    when there is one."""
    if bar.disable:
        print(text, file=sys.stderr, flush=True)
    else:
        bar.write(text, file=bar.fp)


def run_pbt(config: PBTConfig) -> Path:
    """Runs (or resumes) PBT and returns the run folder.

    A run folder with checkpoints is resumed from its newest one (verified by checksum; a corrupt one raises
    ``CheckpointError``). The resumed run finishes bit-identical to an uninterrupted run with the same seed,
    also when ``generations`` was raised since (an extended run; see ``evolve.population.extend``).

    Returns:
        ``run_dir``, holding ``config.json``, ``metrics.jsonl`` (one ``GenerationMetrics`` per line),
        ``lineage.jsonl`` (one ``LineageRecord`` per line), ``checkpoints/`` and ``tb/``.
    """
    run_dir = Path(config.run_dir)
    ckpt_dir = run_dir / "checkpoints"
    for path in (run_dir, ckpt_dir):  # found now, not when the first generation is saved
        if path.exists() and not path.is_dir():
            raise ValueError(f"{path} is a file, not a folder: the run's checkpoints go there")
    # (each was an OSError's "[Errno 17] File exists" / "[Errno 21] Is a directory" naming neither; an audit)
    if config.tensorboard and (run_dir / "tb").exists() and not (run_dir / "tb").is_dir():
        raise ValueError(f"{run_dir / 'tb'} is a file, not a folder: the run's TensorBoard scalars go there")
    if (run_dir / LOCK_FILE).is_dir():
        raise ValueError(f"{run_dir / LOCK_FILE} is a folder, not the run's lock file: remove it")
    if config.tensorboard:
        try:
            os.fsdecode(run_dir).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"run_dir {os.fsdecode(run_dir)!r} is not UTF-8, which TensorBoard's writer needs: choose "
                "another name or set tensorboard=False (populora train --no-tensorboard)"
            ) from None
    _check_nothing_else_replaced(run_dir, ckpt_dir)
    # the thread count before the members exist: some initialise by QR
    with torch_threads(config.torch_threads), _run_lock(run_dir):
        return _run_locked(config, run_dir, ckpt_dir)


class RunInUseError(RuntimeError):
    """Another ``run_pbt`` (in this or another process) holds the run folder."""


LOCK_FILE = ".lock"
"""The file in a run folder that ``run_pbt`` holds an exclusive ``flock`` on while it runs."""


def _in_use(run_dir: str | os.PathLike[str], fd: int) -> RunInUseError:
    """The error for a run folder whose lock file ``fd`` another run holds (it wrote its pid there)."""
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return RunInUseError(
        f"{run_dir} is in use by another run (pid {holder}): wait for it to end or choose another run_dir"
    )


def check_run_free(run_dir: str | os.PathLike[str]) -> None:
    """Raises ``RunInUseError`` when another run holds ``run_dir`` now (a check before slow set-up, e.g.
    building a base model: ``run_pbt`` takes the lock itself). Creates nothing."""
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR)
    except OSError:
        return  # no lock file (no run there yet), or none this process can open: run_pbt tells
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(run_dir, fd) from None
        except OSError:
            pass  # a file system without flock: run_pbt warns
    finally:
        os.close(fd)  # (and releases the lock if it was taken)


@contextlib.contextmanager
def _run_lock(run_dir: Path) -> Iterator[None]:
    """The run folder for this call alone: two runs on one folder both "succeeded" with every metric
    written twice. The kernel releases the lock of a killed process, so a killed run never blocks its
    resume."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(run_dir, fd) from None
        except OSError as error:  # a file system without flock (some network and FUSE mounts)
            logger.warning(
                "%s: cannot lock the run folder (%s): nothing stops a second run there", run_dir, error
            )
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _check_nothing_else_replaced(run_dir: Path, ckpt_dir: Path) -> None:
    """A folder with files a new run replaces (``OVERWRITTEN``) but neither a run config nor a checkpoint
    is refused (before its lock file is made): they were replaced without a word (``--run-dir .`` in a
    project folder)."""
    if (run_dir / "config.json").exists() or list_checkpoints(ckpt_dir):
        return
    if found := [name for name in OVERWRITTEN if (run_dir / name).exists()]:
        raise ValueError(
            f"{run_dir} holds {', '.join(found)} but no run config or checkpoint, and a new run would replace "
            "them: delete that folder (or those files) or choose another run_dir"
        )


def _run_locked(config: PBTConfig, run_dir: Path, ckpt_dir: Path) -> Path:
    remove_temp_files(ckpt_dir)
    remove_temp_files(run_dir, RUN_FILES)  # a kill between a temp file's write and its rename
    saved = load_latest(ckpt_dir)
    newest_file = list_checkpoints(ckpt_dir)[-1] if saved is not None else None
    if saved is None:
        _check_unsaved_start(run_dir, config)
    saved_generations = (
        _check_same_run(saved, config, newest_file)
        if saved is not None and newest_file is not None
        else config.generations
    )
    if (
        saved is not None
    ):  # this run's (checked): a kill after its newest checkpoint, before the old ones went
        prune_checkpoints(ckpt_dir, config.keep_checkpoints)
    table = RatingTable()
    backend = make_backend(config, table)
    log: RunLog | None = None
    bar: Any = None
    try:
        population = Population.create(config, backend.env, table)
        if saved is not None:
            try:
                population.restore(saved)
            except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as error:
                # verified bytes, but not a state of this run (edited and re-saved, another version's): a
                # KeyError or a torch error naming no file (a robustness review)
                raise CheckpointError(
                    f"{newest_file}: not a state this run can resume ({type(error).__name__}: {error}); {DELETE_IT}"
                ) from error
            if config.generations > saved_generations:
                logger.info("extending %s from %d to %d generations", run_dir, saved_generations,
                            config.generations)  # fmt: skip
                extend(population, saved_generations)  # the last record gains its children
        # written whenever it differs: a new run, a length changed, or a file damaged, deleted or edited
        # since (a resumed run is this config's, checked against its checkpoint)
        run_dir.mkdir(parents=True, exist_ok=True)
        config_json = json.dumps(config.fingerprint(), indent=2, sort_keys=True).encode()
        config_path = run_dir / "config.json"
        written = config_path.read_bytes() if config_path.is_file() else None
        if written != config_json:
            if saved is not None and config.generations == saved_generations:
                logger.warning("%s: %s; rewritten from the run's config", config_path,
                               "missing" if written is None else "not the run's config (damaged or edited)")  # fmt: skip
            atomic_write_bytes(config_path, config_json)
        # TensorBoard drops what a killed process logged from the checkpoint's last generation on and gets
        # that generation again: a kill between its checkpoint and its log would have lost its scalars (an
        # extended run's last record also gains its children)
        newest = population.generation - 1 if population.history else population.generation
        log = RunLog(run_dir, config.tensorboard, newest)
        log.rewrite(population.history, [r.to_json() for r in population.lineage])
        if population.history:
            log.scalars(GenerationMetrics(**population.history[-1]))
        bar = tqdm(
            total=config.generations, initial=population.generation, desc="PBT",
            disable=not (config.progress and watched()),
        )  # fmt: skip
        if config.progress:  # what this call does with the folder, once its checks have passed (a review)
            done, total = population.generation, config.generations
            state = (
                f"starting {run_dir}: {total} generation{'' if total == 1 else 's'}" if saved is None
                else f"{run_dir}: all {total} generations done; nothing to run" if done >= total
                else f"resuming {run_dir}: {done} of {total} generations done"
            )  # fmt: skip
            _say(bar, f"run: {state}")
        for generation in range(population.generation, config.generations):
            record = run_generation(population, backend, config, generation)
            last = generation + 1 == config.generations
            if (generation + 1) % config.checkpoint_every == 0 or last:
                save_checkpoint(
                    ckpt_dir, generation + 1, population.state(config.fingerprint()), config.keep_checkpoints
                )
            log.append(record)
            for failure in record.learner_failures:
                logger.warning("generation %d: learner of member %d raised %s: %s", generation,
                               failure["member"], failure["error"], failure["message"])  # fmt: skip
            bar.update(1)
            solve = "-" if record.solve_rate is None else f"{record.solve_rate:.2f}"
            bar.set_postfix(solve=solve, children=len(record.lineage))
            if config.progress:  # one line a generation above the bar (a long run showed only the bar's last)
                rewards = " ".join(
                    f"{role} {value:+.3f}" for role, value in sorted(record.mean_reward.items())
                )
                cut = ", ".join(
                    f"{role} {share:.2f}" for role, share in truncated_shares(record.learner_info).items()
                )
                _say(bar, f"generation {generation}: solve rate {solve}, invalid {record.invalid_rate:.2f}, "
                          f"mean reward {rewards or '-'}, children {len(record.lineage)}"
                          + (f", cut off: {cut}" if cut else ""))  # fmt: skip
    finally:
        if bar is not None:  # closed on an interrupt too: a message after it starts on a line of its own
            bar.close()
        if log is not None:
            log.close()
        backend.close()
    return run_dir
