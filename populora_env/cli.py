"""The ``populora`` command line: ``verify``, ``train``, ``plot`` (one run or a comparison), ``base build``.

Subcommands import their heavy dependencies (torch, ``agents``, ``evolve``) inside their functions, so that
``populora --help`` and ``populora verify`` stay light and ``populora_env`` does not import those packages.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import math
import os
import re
import signal
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

__all__ = [
    "COMMANDS",
    "BaseArgs",
    "PlotArgs",
    "TrainArgs",
    "VerifyArgs",
    "base",
    "main",
    "plot",
    "train",
    "verify",
]


def _help(text: str, **arg: Any) -> Any:
    """``tyro.conf.arg`` with ``text`` as the option's help on one line (tyro kept a field docstring's first
    line break, and ``--help`` broke the text there mid-sentence)."""
    return tyro.conf.arg(help=" ".join(text.split()), **arg)


@dataclass(frozen=True)
class VerifyArgs:
    """Check a JSONL file of {"code", "input"[, "output"]} records with the hardened verifier."""

    path: Annotated[
        Path | None, tyro.conf.Positional, tyro.conf.arg(metavar="[PATH]", help_behavior_hint="")
    ] = None
    """JSONL file to check (CRUXEval/AZR format); `-` reads standard input. Omit it with --examples."""
    examples: bool = False
    """Check the built-in example set (good and hostile programs) instead of a file."""
    timeout: float = 2.0
    """Wall-clock seconds per call."""
    expression_inputs: bool = False
    """Evaluate inputs as expressions inside the sandbox (CRUXEval has inputs like `dict(a=1)`)."""
    json: bool = False
    """Print one JSON object per record, then the summary, instead of text."""
    strict: Annotated[
        bool,
        _help("""Exit with status 1 when any record errors or mismatches its claimed output, a line is
        malformed, or the file holds no records."""),
    ] = False
    workers: Annotated[
        int | None, tyro.conf.arg(metavar="INT", help_behavior_hint="(default: number of CPUs, at most 256)")
    ] = None
    """Worker processes per hash-seed pool."""


def _examples_path() -> Path:
    return Path(str(resources.files("populora_env") / "data" / "examples.jsonl"))


def verify(args: VerifyArgs) -> int:
    """Runs ``populora verify``; returns the exit status."""
    from tqdm import tqdm

    from populora_env.progress import watched
    from populora_env.verifier import Verifier, VerifierConfig
    from populora_env.verifier.jsonl import load_records, summarize, verify_records
    from populora_env.verifier.literals import NEVER_RUN

    if (args.path is None) == (not args.examples):
        print("populora verify: give a JSONL path or --examples (not both)", file=sys.stderr)
        return 2
    try:
        config = VerifierConfig(timeout=args.timeout, workers=args.workers)
    except ValueError as e:  # --timeout 0, --workers -2
        message = (
            str(e)
            .replace("VerifierConfig.timeout", "--timeout")
            .replace("VerifierConfig.workers", "--workers")
            .replace("must be None or an int", "must be an int")  # (None cannot be typed: leave it out)
        )
        print(f"populora verify: {message}", file=sys.stderr)
        return 2
    path = _examples_path() if args.examples else args.path
    assert path is not None
    try:
        records, errors = load_records(path)
    except (FileNotFoundError, OSError) as e:
        print(f"populora verify: {e}", file=sys.stderr)
        return 2
    # --json: a malformed line is an object on stdout in its place among the verdicts (file order); text: a
    # warning on stderr up front
    pending = list(reversed(errors)) if args.json else []
    for error in [] if args.json else errors:
        print(f"{path}:{error.line}: skipped: {error.reason}", file=sys.stderr)

    def malformed_before(line: int) -> None:
        while pending and pending[-1].line < line:
            error = pending.pop()
            print(json.dumps({"line": error.line, "verdict": "malformed", "reason": error.reason}))

    start = time.perf_counter()
    verdicts = []
    try:
        with Verifier(config) as verifier:
            stream = verify_records(verifier, records, expression_inputs=args.expression_inputs)
            for v in tqdm(
                stream, total=len(records), desc="verifying", unit="prog", file=sys.stderr, leave=False,
                disable=not watched(),  # (no bar in a log file or a pipe; an audit)
            ):  # fmt: skip
                verdicts.append(v)
                malformed_before(v.record.line)
                _print_verdict(v, as_json=args.json)
            isolation = verifier.isolation
        malformed_before(sys.maxsize)
    except KeyboardInterrupt:
        print(
            f"populora verify: interrupted after {len(verdicts)} of {len(records)} records", file=sys.stderr
        )
        return 128 + signal.SIGINT
    elapsed = time.perf_counter() - start
    summary = summarize(verdicts, errors)
    if args.json:
        print(
            json.dumps(
                {"summary": asdict(summary), "seconds": round(elapsed, 3), "isolation": asdict(isolation)}
            )
        )
    else:
        print(f"\n{path}: {summary.records} record{'' if summary.records == 1 else 's'} in {elapsed:.1f} s")
        ran = f"  ran {summary.ran} (no output claimed)" if summary.ran else ""
        print(f"  pass {summary.passed}{ran}  mismatch {summary.mismatched}  error {summary.errors}  "
              f"malformed lines {summary.malformed_lines}")  # fmt: skip
        print("  statuses: " + ", ".join(f"{k} {n}" for k, n in sorted(summary.statuses.items())))
        active = [k for k, on in asdict(isolation).items() if k != "errors" and on]
        print(f"  isolation: {'full' if isolation.full else 'PARTIAL'} ({', '.join(active)})")
    calls = sum(v.execution.status == "bad_input" and NEVER_RUN in v.execution.detail
                for v in verdicts)  # fmt: skip
    # (CRUXEval's file without the flag: 12 errors and no word why; not for --examples, whose input that is code
    # is one of its hostile records: the hint pointed at evaluating it, an audit)
    if calls and not args.expression_inputs and not args.examples:
        print(f"populora verify: {calls} input(s) are not literals (such as dict(a=1)); --expression-inputs "
              "evaluates inputs as expressions in the sandbox", file=sys.stderr)  # fmt: skip
    failed = summary.mismatched + summary.errors + summary.malformed_lines
    if args.strict and not summary.records:  # an empty or truncated dataset must not pass a CI check
        print(f"populora verify: --strict: {path} holds no records", file=sys.stderr)
        return 1
    return 1 if args.strict and failed else 0


def _print_verdict(v: Any, *, as_json: bool) -> None:
    e = v.execution
    if as_json:
        print(json.dumps({"line": v.record.line, "id": v.record.id, "verdict": v.verdict, "status": e.status,
                          "output": e.output,
                          "claimed": v.record.output, "detail": e.detail, "reason": v.reason},
                         ensure_ascii=False))  # fmt: skip
        return
    shown = _printable(v.reason or (e.output if e.ok else e.detail) or "")
    shown = shown if len(shown) <= 70 else shown[:67] + "..."
    print(f"{v.verdict:<8} {e.status:<16} {_printable(v.record.id):<24} {shown}")


def _printable(text: str) -> str:
    """``text`` for a terminal line: a newline as a space, any other character that is not printable (control
    characters, ESC sequences, a carriage return, bidirectional overrides) escaped as Python would write it.
    Record ids and error details are the dataset's or a program's text: a carriage return and ESC sequences
    made a runtime error's line read as a pass (a red-team review)."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else " " if c == "\n" else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


# ----- populora train ---------------------------------------------------------------------------------------
Preset = Literal["population", "self-play", "1t1s", "4t8s"]

# Seats, members per role, self-play and matching of each preset (the paper's baselines and its setup).
_PRESETS: dict[str, dict[str, Any]] = {
    "population": {"n_teachers": 1, "n_students": 1, "population": 4, "self_play": False, "pfsp": False},
    "self-play": {"n_teachers": 1, "n_students": 1, "population": 1, "self_play": True, "pfsp": False},
    "1t1s": {"n_teachers": 1, "n_students": 1, "population": 1, "self_play": False, "pfsp": False},
    "4t8s": {"n_teachers": 4, "n_students": 8, "population": 8, "self_play": False, "pfsp": True},
}


@dataclass(frozen=True)
class TrainArgs:
    """Train LoRA teachers and students on one frozen base: GRPO plus weight-space evolution (PBT).

    Rerunning the same command with the same --run-dir resumes the run from its last checkpoint.
    """

    preset: Annotated[
        Preset,
        _help("""population: 1 teacher x 1 student seat, 4 evolving members per role (PopuLoRA at CPU size);
        self-play: one member plays both seats of a 1x1 game (AZR's baseline); 1t1s: one teacher and one
        student member; 4t8s: 4 teacher and 8 student seats, 8 members per role, PFSP matching
        (GPU-sized)."""),
    ] = "population"
    # (text, not Path: tyro makes "" the Path ".", and an unset variable in `--run-dir "$RUN"` wrote the run
    # into the working folder; an audit)
    run_dir: Annotated[
        str,
        _help(
            """Run folder: config.json, metrics.jsonl, lineage.jsonl, curves.png, tb/ (TensorBoard),
        checkpoints/, error.log after a failure.""",
            metavar="PATH",
        ),
    ] = "runs/populora-train"
    generations: Annotated[
        int,
        _help("""PBT generations (play, GRPO update, rate, replace the weakest by crossover and mutation);
        raise it on an existing --run-dir to extend that run."""),
    ] = 10
    seed: int = 0
    """Seed of everything random in the run."""
    base: Annotated[
        str | None,
        _help(
            """Base model: a local Hugging Face directory or a Hub id; default: the tiny offline base (built
            and cached on first use: a few CPU-minutes). The tiny base demonstrates the mechanics; research
            runs use a real base (e.g. Qwen2.5-Coder) on a GPU.""",
            metavar="STR",
            help_behavior_hint="",
        ),
    ] = None
    population: Annotated[
        int | None, tyro.conf.arg(metavar="INT", help_behavior_hint="(default: the preset's)")
    ] = None
    """Members per role."""
    episodes: Annotated[
        int | None,
        tyro.conf.arg(metavar="INT", help_behavior_hint="(default: just enough for every member to play)"),
    ] = None
    """Episodes per generation."""
    rounds: int = 2
    """Rounds per episode."""
    group_size: int = 4
    """Proposals per teacher and attempts per student on one observation (a GRPO group; at least 2)."""
    max_new_tokens: int = 64
    """Generation budget per action."""
    rank: int = 8
    """LoRA rank."""
    learning_rate: Annotated[
        float,
        _help(
            """AdamW learning rate of the adapters (3e-3: at 1e-2 the tiny base's teachers lost the answer
            format, up to 0.84 of proposals invalid in the tenth generation; see the README)."""
        ),
    ] = 3e-3
    threads: Annotated[
        int,
        _help("""Torch threads while training (a model as small as the tiny base gains little from more;
        building the tiny base uses every core)."""),
    ] = 1
    cache_dir: Annotated[
        str | None,
        tyro.conf.arg(
            metavar="PATH", help_behavior_hint="(default: $POPULORA_CACHE_DIR or ~/.cache/populora)"
        ),
    ] = None
    """Cache of tiny bases."""
    tensorboard: bool = True
    """Write TensorBoard scalars under run_dir/tb."""
    persist_buffer: Annotated[
        bool,
        _help("""Keep the task buffer (the reference tasks teachers are shown, the duplicate check) from
        episode to episode and generation to generation, as AZR's grows over training; it is saved with
        each checkpoint. --no-persist-buffer starts every episode from the seed tasks."""),
    ] = True
    deterministic: Annotated[
        bool,
        _help("""On a GPU, GRPO updates use deterministic kernels, so a rerun or a resumed run is
        bit-identical; --no-deterministic lets CUDA pick faster kernels whose results vary in the last bits.
        CPU kernels are deterministic either way, but the option is part of the run's config: resume with
        the same value."""),
    ] = True
    mask_truncated_completions: Annotated[
        bool,
        _help("""Leave answers cut off at --max-new-tokens out of the GRPO loss (DAPO's overlong filtering, TRL's
        option of that name); their rewards still count in their groups' advantages. Off by default: the format
        penalty of a cut-off answer is then what teaches a member to stop. Part of the run's config."""),
    ] = False


def _train_config(args: TrainArgs, base: str) -> Any:
    """The ``PBTConfig`` of a ``populora train`` command."""
    from evolve.pbt import PBTConfig
    from populora_env.game import TeacherStudentConfig

    preset = _PRESETS[args.preset]
    population = args.population if args.population is not None else preset["population"]
    seats = min(preset["n_teachers"], preset["n_students"])
    episodes = args.episodes if args.episodes is not None else -(-population // seats)
    env = TeacherStudentConfig(
        mode="text", n_teachers=preset["n_teachers"], n_students=preset["n_students"], rounds=args.rounds,
        task_types=("deduction", "abduction"), teacher_group_size=args.group_size,
        student_group_size=args.group_size, students_per_task=2 if preset["pfsp"] else 1,
        # Above the format penalty (-1): pays a weak base for the answer format first (as examples/02).
        teacher_invalid_penalty=-0.5, persist_buffer=args.persist_buffer,
    )  # fmt: skip
    lora = {"base": base, "rank": args.rank, "max_new_tokens": args.max_new_tokens, "prefill": True}
    grpo: dict[str, Any] = {"learning_rate": args.learning_rate}
    if not args.deterministic:  # only when changed: runs made before the option keep their fingerprint
        grpo["deterministic"] = False
    if args.mask_truncated_completions:  # (likewise)
        grpo["mask_truncated_completions"] = True
    return PBTConfig(
        run_dir=str(args.run_dir), seed=args.seed, generations=args.generations,
        episodes_per_generation=episodes, env=env, teachers="lora", students="lora", population=population,
        self_play=preset["self_play"], pfsp=preset["pfsp"], learner="grpo",
        member_options={"lora": lora, "grpo": grpo},
        replace_fraction=0.5 if population < 4 else 0.25, tensorboard=args.tensorboard,
    )  # fmt: skip


_FLAGS = {  # config fields the train command sets from an option of another name
    "episodes_per_generation": "--episodes",
    "teacher_group_size": "--group-size",
    "student_group_size": "--group-size",
    "member_options['lora']['rank']": "--rank",
    "member_options['lora']['max_new_tokens']": "--max-new-tokens",
    "member_options['grpo']['learning_rate']": "--learning-rate",
    "GRPOConfig.learning_rate": "--learning-rate",  # (its own checks: float32's range)
    # as a resumed run's config differences name them
    "env.teacher_group_size": "--group-size",
    "env.student_group_size": "--group-size",
    "env.rounds": "--rounds",
    "member_options.lora.base": "--base",
    "member_options.lora.rank": "--rank",
    "member_options.lora.max_new_tokens": "--max-new-tokens",
    "member_options.grpo.learning_rate": "--learning-rate",
    "member_options.grpo.deterministic": "--deterministic",
    "member_options.grpo.mask_truncated_completions": "--mask-truncated-completions",
    "env.persist_buffer": "--persist-buffer",
    "self_play": "--preset",  # (no option of its own: the preset sets it)
    "pfsp": "--preset",
    "replace_fraction": "--population",  # (0.5 under 4 members, else 0.25)
}
# each field alone, not inside a longer path (`env.teacher_group_size` names its flag once)
_FLAG_FIELDS = re.compile(
    r"(?<![\w.'\]])("
    + "|".join(re.escape(f) for f in sorted(_FLAGS, key=len, reverse=True))
    + r")(?![\w'\[])"
)


# options of the config field's own name, named as options where a message starts with the field
_SAME_NAMED = re.compile(r"(?:^|(?<=differ: )|(?<=; ))(generations|population|rank|rounds|seed)(?= must|: )")


def _as_flags(message: str) -> str:
    """``message`` with the config fields that ``populora train`` options set named as those options too
    (``episodes_per_generation`` was all a user of ``--episodes`` read; ``generations must be ...`` now reads
    ``--generations must be ...``, "another run_dir" "another --run-dir")."""
    message = _SAME_NAMED.sub(lambda m: "--" + m[1], message)
    message = message.replace("choose another run_dir", "choose another --run-dir")
    return _FLAG_FIELDS.sub(lambda m: f"{_FLAGS[m[1]]} ({m[1]})", message)


def _summary_table(rows: list[dict[str, Any]]) -> str:
    """One line per generation of ``metrics.jsonl``'s records, with why proposals were rejected and which
    learners raised. ``t-cut`` and ``s-cut``: the shares of the teachers' and the students' answers the learners
    trained on that were cut off at the token budget (``-`` where no learner counted them by role, as in
    records written before it did)."""
    from evolve.protocols import ROLES
    from evolve.runlog import truncated_share

    header = f"{'gen':>3}  {'solve':>5}  {'teacher':>7}  {'student':>7}  {'invalid':>7}  {'t-cut':>5}  " \
             f"{'s-cut':>5}  {'depth':>5}  {'lines':>5}  {'children':>8}"  # fmt: skip
    lines = [header, "-" * len(header)]
    for r in rows:
        reward = r["mean_reward"]
        teacher, student = (f"{reward[k]:+7.3f}" if k in reward else f"{'-':>7}" for k in ROLES)
        cut = "  ".join(_rate(truncated_share(r.get("learner_info", {}), role), 5) for role in ROLES)
        lines.append(
            f"{r['generation']:>3}  {_rate(r['solve_rate'], 5)}  {teacher}  {student}  {r['invalid_rate']:7.2f}  "
            f"{cut}  {r['difficulty']['depth']:5.2f}  {r['difficulty']['lines']:5.2f}  {len(r['lineage']):>8}"
        )
    rejections: Counter[str] = Counter()
    for r in rows:
        rejections.update(r.get("rejections", {}))  # (absent from records written before it existed)
    if rejections:
        total = sum(rejections.values())
        common = ", ".join(
            f"{reason} {_percent(count, total)}" for reason, count in rejections.most_common(6)
        )
        lines.append(f"\nwhy proposals were rejected ({total} in all): {common}")
    failed, updates = _learner_failures(rows)
    if failed:
        first = failed[0]
        lines.append(
            f"\nlearner failures: {len(failed)} of {updates} updates raised and were undone (first: generation "
            f"{first['generation']}, member {first['member']}: {first['error']}: {first['message']})"
        )
    return "\n".join(lines)


def _percent(count: int, total: int) -> str:
    """``count`` of ``total`` as a whole percentage, a nonzero count under 0.5% as ``<1%`` (it read 0%)."""
    share = f"{count / total:.0%}"
    return "<1%" if count > 0 and share == "0%" else share


def _learner_failures(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The learner failures of a run's metrics records, and the number of updates tried (those that ran
    have a loss, those that raised a failure)."""
    failed = [f for r in rows for f in r.get("learner_failures", [])]
    return failed, len(failed) + sum(len(r.get("losses", {})) for r in rows)


def _option(field: str) -> str:
    """The command-line option of a dataclass field (``corpus_documents``: ``--corpus-documents``)."""
    return "--" + field.replace("_", "-")


def _check_paths(*options: tuple[str, str | None]) -> None:
    """A ``ValueError`` for an option given as an empty or blank text (a path: the working folder)."""
    for name, value in options:
        if value is not None and not value.strip():
            raise ValueError(f"{name} must not be empty, got {value!r}")


def train(args: TrainArgs) -> int:
    """Runs ``populora train``; returns the exit status."""
    import torch
    import transformers

    import agents.members  # noqa: F401  # registers the "lora" members and the "grpo" learner
    from agents.base import BaseModelLoadError, build_tiny_base, missing_local_dir
    from agents.members import LoRAMemberOptions, grpo_config
    from evolve.checkpoint import CheckpointError
    from evolve.pbt import RunInUseError, check_run_free, run_pbt
    from evolve.plots import plot_run

    # PEFT calls a transformers method deprecated in v5 on every adapter it adds: noise, not a problem here
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    # and transformers' own bars for every load and save of a member ("Loading weights", "Writing model
    # shards") broke up the run's one bar and its generation lines (a review); kept for a Hub id, whose
    # download they show, and restored at the end (the switch is the process's)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    if args.base is None or Path(args.base).expanduser().is_dir():
        transformers.utils.logging.disable_progress_bar()
    start = time.perf_counter()
    started = False
    made: list[Path] = []  # the folders this command made for --run-dir, itself first
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm) if _main_thread() else None
    try:
        # Every option is checked before the tiny base is built (minutes on a fresh machine): the base's
        # path is the only part of the config that waits for it.
        _check_paths(("--run-dir", args.run_dir), ("--cache-dir", args.cache_dir), ("--base", args.base))
        _check_threads(args.threads)
        if not isinstance(args.group_size, int) or args.group_size < 2:  # named as the option, not the env's
            raise ValueError(  # two fields
                f"--group-size must be an int >= 2 (GRPO's advantages are relative to the group: a group of one "
                f"has none, and nothing learns), got {args.group_size!r}"
            )
        if args.preset in ("1t1s", "self-play") and args.population not in (None, 1):
            raise ValueError(  # (1t1s with --population 2 was the population preset, and said to be 1t1s; an audit)
                f"--preset {args.preset} has one member per role, got --population {args.population} (--preset "
                "population evolves several)"
            )
        if not (isinstance(args.learning_rate, int | float) and 0 < args.learning_rate < math.inf):
            raise ValueError(f"--learning-rate must be a finite number > 0, got {args.learning_rate!r}")
        config = _train_config(args, args.base or "tiny-base")
        lora = LoRAMemberOptions.from_member_options(config.member_options)
        grpo_config(config.member_options, lora)
        if Path(args.run_dir).is_file():
            raise ValueError(f"--run-dir {args.run_dir} is a file, not a folder")
        if (
            args.base is not None and Path(args.base).expanduser().is_file()
        ):  # ("no such model folder"; an audit)
            raise ValueError(f"--base {args.base} is a file, not a model folder")
        if args.base is not None and missing_local_dir(args.base):
            raise ValueError(f"--base {args.base}: no such model folder")  # found before any folder is made
        check_run_free(args.run_dir)  # before the base is built (minutes), not after (an audit)
        made = [p for p in (Path(args.run_dir), *Path(args.run_dir).parents) if not p.exists()]
        Path(args.run_dir).mkdir(parents=True, exist_ok=True)  # an unusable --run-dir fails now, not after
        if args.base is None:
            print(
                "tiny base: building or loading from the cache (first build: a few minutes)", file=sys.stderr
            )
            built = build_tiny_base(args.cache_dir)  # its pretraining batches use every core
            # absolute, so that the run resumes (and its base loads) from any folder
            base = _recorded_base(Path(args.run_dir), built) or os.path.abspath(built)
        elif Path(args.base).expanduser().is_dir():
            # a local folder is recorded absolute: a resume from another folder loads this model, not one
            # of the same relative name there
            local = Path(os.path.abspath(Path(args.base).expanduser()))
            base = _recorded_base(Path(args.run_dir), local) or str(local)
        else:  # a Hub id
            base = args.base
        torch.set_num_threads(args.threads)
        config = _train_config(args, base)
        started = True
        run_dir = run_pbt(config)
    except RunInUseError as error:  # the folder is another run's now: nothing of it is touched
        print(f"populora train: {_as_flags(str(error))}", file=sys.stderr)
        return 2
    # (BaseModelLoadError is an OSError: it comes first)
    except (ValueError, BaseModelLoadError, CheckpointError) as error:
        message = _as_flags(str(error))
        if "holds a run with another config" in message:
            message = _readable_options(message)
            made_with = _saved_presets(Path(args.run_dir) / "config.json")
            if (
                made_with and args.preset not in made_with
            ):  # (it read as --population and --episodes; an audit)
                message += "; it was made with " + " or ".join(f"--preset {name}" for name in made_with)
            message += (
                "; rerun with the options it was made with (its config.json), or give another --run-dir"
            )
        print(f"populora train: {message}", file=sys.stderr)
        _remove_if_made_and_empty(Path(args.run_dir), made)
        return 2
    except OSError as error:  # an unwritable --run-dir or --cache-dir, a full disk
        # once the run has begun (the error may stay until mended: a full disk, a file where a folder goes)
        hint = f"; once mended, {_resume_hint(Path(args.run_dir), args.generations)}" if started else ""
        print(f"populora train: {error}{hint}", file=sys.stderr)
        _remove_if_made_and_empty(Path(args.run_dir), made)
        return 2
    except Exception as error:  # inside the run: out of memory, a CUDA error, a bug of ours
        if not started:  # the checks before the run raise the errors above: anything else is a bug there
            raise
        failure, hint = (
            _failure(error, Path(args.run_dir)),
            _resume_hint(Path(args.run_dir), args.generations),
        )
        print(f"populora train: {failure}; once mended, {hint}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Terminated) as stop:
        name = "SIGTERM" if isinstance(stop, _Terminated) else "SIGINT"
        print(
            f"populora train: stopped by {name}; {_resume_hint(Path(args.run_dir), args.generations)}",
            file=sys.stderr,
        )
        _remove_if_made_and_empty(Path(args.run_dir), made)  # (stopped while the base was built: no run yet)
        return 128 + (signal.SIGTERM if isinstance(stop, _Terminated) else signal.SIGINT)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if bars:
            transformers.utils.logging.enable_progress_bar()
    elapsed = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    print(_summary_table(rows))
    plural = "" if config.generations == 1 else "s"
    print(f"\n{args.preset} run of {config.generations} generation{plural} in {run_dir} ({elapsed:.0f} s):")
    print(f"  metrics      {run_dir / 'metrics.jsonl'} (one record per generation)")
    print(f"  lineage      {run_dir / 'lineage.jsonl'}")
    if args.tensorboard:
        print(f"  tensorboard  tensorboard --logdir {run_dir / 'tb'}")
    try:
        print(f"  curves       {plot_run(run_dir)}")
    except (OSError, ValueError) as error:  # the run is saved: a figure that cannot be drawn is no failure
        print(f"  curves       not drawn ({error})")
    print(f"  checkpoints  {run_dir / 'checkpoints'} (rerun the same command to resume, with a larger "
          "--generations to extend)")  # fmt: skip
    failed, updates = _learner_failures(rows)
    if failed and len(failed) == updates:  # a run that went through every generation and trained nothing
        print(f"populora train: every learner update raised ({updates} of {updates}): nothing was trained; "
              "see the learner failures above", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _check_threads(threads: Any) -> None:
    """``--threads``: at least one, at most this machine's CPUs (torch's thread pool took 100 000 without a
    word, and the first parallel product crashed the process: SIGSEGV)."""
    cpus = os.cpu_count() or 1
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= cpus:
        raise ValueError(f"--threads must be an int from 1 to {cpus} (this machine's CPUs), got {threads!r}")


def _failure(error: Exception, run_dir: Path) -> str:
    """One line on an error that stopped a run: what it was, where it was raised, and where its traceback
    went (``error.log`` in the run folder; printed here when that cannot be written)."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    where = f"at {frames[-1].filename}:{frames[-1].lineno}; " if frames else ""
    text = "".join(traceback.format_exception(error))
    log = run_dir / "error.log"
    try:
        log.write_text(text)
        kept = f"traceback in {log}"
    except OSError:
        print(text, file=sys.stderr, end="")
        kept = "traceback above"
    message = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {message} ({where}{kept})"


def _recorded_base(run_dir: Path, built: Path) -> str | None:
    """The base path the run in ``run_dir`` recorded, when it names the folder just built (or given) by
    another path (a cache reached through a link, a relative ``--cache-dir``): a run records its base by
    path, and the same base under another name read as another config."""
    try:
        saved = json.loads((run_dir / "config.json").read_text())["member_options"]["lora"]["base"]
        if isinstance(saved, str) and os.path.samefile(saved, built):
            return saved
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no run there yet, or not one of populora train's
    return None


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt so that the run closes cleanly."""


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _remove_if_made_and_empty(run_dir: Path, made: list[Path]) -> None:
    """The run folder this command made, if a failure before the run's first file left it empty but for
    its lock file (a base that did not load): removed with that file, under the lock, so that a run that
    took the folder meanwhile keeps it (it holds the lock); then the folders above it that this command made
    (``made``, the run folder first), while empty (an empty ``runs/`` was left behind; an audit)."""
    from evolve.pbt import LOCK_FILE

    if not made:
        return
    with contextlib.suppress(OSError):  # gone, or not empty: left as it is
        if [p.name for p in run_dir.iterdir()] == [LOCK_FILE]:
            fd = os.open(run_dir / LOCK_FILE, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: another run holds it
                (run_dir / LOCK_FILE).unlink()
            finally:
                os.close(fd)
        run_dir.rmdir()
        for parent in made[1:]:
            parent.rmdir()  # (OSError: not empty, another run's meanwhile)


def _saved_presets(path: Path) -> list[str]:
    """The presets that made the run config at ``path``: those of its seats, self-play and matching, and of its
    population where one of them has it (``population`` and ``1t1s`` differ in it alone); [] when it cannot
    be read."""
    try:
        saved = json.loads(path.read_text())
        shape = (saved["env"]["n_teachers"], saved["env"]["n_students"], saved["self_play"], saved["pfsp"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    names = [
        n
        for n, p in _PRESETS.items()
        if (p["n_teachers"], p["n_students"], p["self_play"], p["pfsp"]) == shape
    ]
    return [n for n in names if _PRESETS[n]["population"] == saved.get("population")] or names


def _readable_options(message: str) -> str:
    """A difference in ``--deterministic``, ``--persist-buffer`` or ``--mask-truncated-completions`` as the
    options read: the first is saved only when it was turned off (``null`` is the default, on), so the message
    read "saved null, now false", the third only when turned on; the second is off in every run made before it
    was the default."""
    for field, flag, without, with_ in (  # (the saved values of a run made without the flag given, and with)
        ("--deterministic (member_options.grpo.deterministic)", "--no-deterministic", "null", "false"),
        ("--persist-buffer (env.persist_buffer)", "--no-persist-buffer", "true", "false"),
        (
            "--mask-truncated-completions (member_options.grpo.mask_truncated_completions)",
            "--mask-truncated-completions", "null", "true",
        ),
    ):  # fmt: skip
        for saved, now, made in ((without, with_, "without"), (with_, without, "with")):
            message = message.replace(
                f"{field}: saved {saved}, now {now}", f"{flag}: the run was made {made} it"
            )
    return message


def _resume_hint(run_dir: Path, generations: int) -> str:
    """Where a stopped run of ``generations`` stands: its newest checkpoint, and what the same command does."""
    from evolve.checkpoint import checkpoint_generation, list_checkpoints

    try:
        saved = list_checkpoints(run_dir / "checkpoints")
    except OSError as error:  # the failure being reported may be this folder's
        return f"its checkpoints cannot be listed ({error})"
    if not saved:
        return f"no checkpoint in {run_dir} yet: the same command starts the run again"
    if checkpoint_generation(saved[-1]) >= generations:  # (it said "resumes it" of a finished run; an audit)
        return (
            f"the run is finished ({saved[-1]}): the same command prints its summary, a larger --generations "
            "extends it"
        )
    return f"the same command resumes it from {saved[-1]} (and ends as an uninterrupted run would)"


@dataclass(frozen=True)
class BaseArgs:
    """Build the tiny offline base into the cache (a BPE tokenizer and a small Llama pretrained on generated
    programs in the game's format), or find it there, and print its model directory. `populora train`
    builds it on first use too; it demonstrates the mechanics, research runs use a real base on a GPU."""

    action: Annotated[Literal["build"], tyro.conf.Positional]
    """What to do: build (or find in the cache) and print its model directory."""
    cache_dir: Annotated[
        str | None,
        tyro.conf.arg(
            metavar="PATH", help_behavior_hint="(default: $POPULORA_CACHE_DIR or ~/.cache/populora)"
        ),
    ] = None
    """Cache root."""
    steps: int = 360
    """Pretraining steps (the default base: 360, a few CPU-minutes)."""
    corpus_documents: int = 6000
    """Generated documents for the tokenizer and pretraining."""
    seed: int = 0
    """Seed of the corpus, the weights and the batch order."""
    threads: Annotated[int | None, tyro.conf.arg(metavar="INT", help_behavior_hint="(default: torch's)")] = (
        None
    )
    """Torch threads during the build."""


def base(args: BaseArgs) -> int:
    """Runs ``populora base build``; prints the model directory and returns the exit status."""
    from agents.base import TinyBaseConfig, build_tiny_base

    try:
        _check_paths(("--cache-dir", args.cache_dir))
        if args.threads is not None:
            _check_threads(args.threads)
        warmup = min(TinyBaseConfig.warmup_steps, max(args.steps, 0))  # a short build warms up less
        config = TinyBaseConfig(
            steps=args.steps, warmup_steps=warmup, corpus_documents=args.corpus_documents, seed=args.seed
        )
        previous = signal.signal(signal.SIGTERM, _stop_on_sigterm) if _main_thread() else None
        try:  # SIGTERM as Ctrl-C: the build's staging folder is removed on the way out
            print(build_tiny_base(args.cache_dir, config, num_threads=args.threads))
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    except (OSError, ValueError) as error:
        # the config fields the options set, named as the options ("TinyBaseConfig.steps must be ...")
        message = re.sub(
            r"\bTinyBaseConfig\.(steps|corpus_documents|seed)\b", lambda m: _option(m[1]), str(error)
        )
        print(f"populora base: {message}", file=sys.stderr)
        return 2
    except _Terminated:
        print("populora base: stopped by SIGTERM (nothing was cached)", file=sys.stderr)
        return 128 + signal.SIGTERM
    return 0


@dataclass(frozen=True)
class PlotArgs:
    """Draw a run's learning curves (solve and invalid rates, rewards, fitness, difficulty) into an image, or
    compare several runs (e.g. the self-play, 1t1s and 4t8s presets) in one figure and a table."""

    run_dirs: Annotated[
        tuple[Path, ...],
        tyro.conf.Positional,
        tyro.conf.arg(metavar="RUN_DIR [RUN_DIR ...]", help_behavior_hint=""),
    ]
    """Run folders of populora train / run_pbt (holding metrics.jsonl); two or more are compared."""
    out: Annotated[
        Path | None,
        _help(
            """Where to write the figure: its extension picks the format (.png, .pdf, .svg; matplotlib's; none:
            .png), an existing folder gets curves.png or compare.png.""",
            metavar="PATH",
            help_behavior_hint="(default: RUN_DIR/curves.png for one run, ./compare.png for several)",
        ),
    ] = None


def _rate(value: float | None, width: int) -> str:
    """A rate in a table column: ``-`` where there is none (``None``: no student attempted a task, no learner
    counted cut-off completions)."""
    return f"{'-':>{width}}" if value is None else f"{value:{width}.2f}"


def _comparison_table(rows: list[dict[str, Any]]) -> str:
    """``summary_rows`` as aligned text: one line per run, one column per metric."""
    from evolve.plots import COMPARED_COLUMNS as columns

    width = max(len(row["run"]) for row in rows)
    lines = [f"{'run':<{width}}  {'gens':>4}  " + "  ".join(f"{name:>8}" for name, _ in columns)]
    lines.append("-" * len(lines[0]))
    for row in rows:
        values = "  ".join(f"{'-':>8}" if math.isnan(row[key]) else f"{row[key]:8.3f}" for _, key in columns)
        lines.append(f"{row['run']:<{width}}  {row['generations']:>4}  {values}")
    return "\n".join(lines) + "\n(means over the last third of each run's generations)"


def plot(args: PlotArgs) -> int:
    """Runs ``populora plot``; returns the exit status."""
    from evolve.plots import compare_runs, plot_run, summary_rows

    try:
        if not args.run_dirs:
            raise ValueError("give at least one run folder")
        if len(args.run_dirs) == 1:
            print(plot_run(args.run_dirs[0], args.out))
        else:
            runs: list[str | Path] = list(args.run_dirs)
            print(_comparison_table(summary_rows(runs)))
            print(compare_runs(runs, args.out if args.out is not None else Path("compare.png")))
    except (OSError, ValueError) as error:
        print(f"populora plot: {error}", file=sys.stderr)
        return 2
    return 0


#: Subcommands: name -> (argument dataclass, function taking it and returning an exit status).
COMMANDS: dict[str, tuple[type, Callable[[Any], int]]] = {
    "verify": (VerifyArgs, verify),
    "train": (TrainArgs, train),
    "plot": (PlotArgs, plot),
    "base": (BaseArgs, base),
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``populora`` console script."""
    parsed = tyro.extras.subcommand_cli_from_dict(
        {name: spec[0] for name, spec in COMMANDS.items()},
        prog="populora",
        args=argv,
        description="populora-env: teacher/student self-play with verifiable rewards.",
    )
    for stream in (sys.stdout, sys.stderr):  # text from the user's files (a lone surrogate in an id)
        reconfigure = getattr(stream, "reconfigure", None)  # is printed escaped, not a UnicodeEncodeError
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    for name, (kind, run) in COMMANDS.items():
        if isinstance(parsed, kind):
            try:
                return run(parsed)
            except BrokenPipeError:  # `populora verify --examples | head -1`: the reader has gone
                _silence_stdout()
                return 128 + signal.SIGPIPE
            except KeyboardInterrupt:  # train and verify say where they stopped; base and plot stop here
                # (a base build leaves no cache: said as for SIGTERM, which read otherwise; an audit)
                done = " (nothing was cached)" if name == "base" else ""
                print(f"populora {name}: stopped by SIGINT{done}", file=sys.stderr)
                return 128 + signal.SIGINT
    raise AssertionError(f"unhandled command {parsed!r}")


def _silence_stdout() -> None:
    """Points standard output at /dev/null, so that the interpreter's final flush finds no broken pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a real file (a test's capture): nothing will be flushed to a pipe


if __name__ == "__main__":
    sys.exit(main())
