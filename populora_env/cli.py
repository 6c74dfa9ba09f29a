"""The ``populora`` command line: ``populora verify ...`` (more subcommands join as the package grows)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import tyro

__all__ = ["COMMANDS", "VerifyArgs", "main", "verify"]


@dataclass(frozen=True)
class VerifyArgs:
    """Check a JSONL file of {"code", "input"[, "output"]} records with the hardened verifier."""

    path: Annotated[Path | None, tyro.conf.Positional] = None
    """JSONL file to check (CRUXEval/AZR format). Omit it with --examples."""
    examples: bool = False
    """Check the built-in example set (good and hostile programs) instead of a file."""
    timeout: float = 2.0
    """Wall-clock seconds per call."""
    expression_inputs: bool = False
    """Evaluate inputs as expressions inside the sandbox (CRUXEval has inputs like `dict(a=1)`)."""
    json: bool = False
    """Print one JSON object per record, then the summary, instead of text."""
    strict: bool = False
    """Exit with status 1 when any record errors or mismatches its claimed output."""
    workers: int | None = None
    """Worker processes per hash-seed pool (default: number of CPUs)."""


def _examples_path() -> Path:
    return Path(str(resources.files("populora_env") / "data" / "examples.jsonl"))


def verify(args: VerifyArgs) -> int:
    """Runs ``populora verify``; returns the exit status."""
    from tqdm import tqdm

    from populora_env.verifier import Verifier
    from populora_env.verifier.jsonl import load_records, summarize, verify_records

    if (args.path is None) == (not args.examples):
        print("populora verify: give a JSONL path or --examples (not both)", file=sys.stderr)
        return 2
    path = _examples_path() if args.examples else args.path
    assert path is not None
    try:
        records, errors = load_records(path)
    except (FileNotFoundError, OSError) as e:
        print(f"populora verify: {e}", file=sys.stderr)
        return 2
    for error in errors:
        print(f"{path}:{error.line}: skipped: {error.reason}", file=sys.stderr)
    start = time.perf_counter()
    verdicts = []
    with Verifier(timeout=args.timeout, workers=args.workers) as verifier:
        stream = verify_records(verifier, records, expression_inputs=args.expression_inputs)
        for v in tqdm(
            stream, total=len(records), desc="verifying", unit="prog", file=sys.stderr, leave=False
        ):
            verdicts.append(v)
            _print_verdict(v, as_json=args.json)
        isolation = verifier.isolation
    elapsed = time.perf_counter() - start
    summary = summarize(verdicts, errors)
    if args.json:
        print(
            json.dumps(
                {"summary": asdict(summary), "seconds": round(elapsed, 3), "isolation": asdict(isolation)}
            )
        )
    else:
        print(f"\n{path}: {summary.records} records in {elapsed:.1f} s")
        print(f"  pass {summary.passed}  mismatch {summary.mismatched}  error {summary.errors}  "
              f"malformed lines {summary.malformed_lines}")  # fmt: skip
        print("  statuses: " + ", ".join(f"{k} {n}" for k, n in sorted(summary.statuses.items())))
        active = [k for k, on in asdict(isolation).items() if k != "errors" and on]
        print(f"  isolation: {'full' if isolation.full else 'PARTIAL'} ({', '.join(active)})")
    failed = summary.mismatched + summary.errors + summary.malformed_lines
    return 1 if args.strict and failed else 0


def _print_verdict(v: Any, *, as_json: bool) -> None:
    e = v.execution
    if as_json:
        print(json.dumps({"id": v.record.id, "verdict": v.verdict, "status": e.status, "output": e.output,
                          "detail": e.detail}, ensure_ascii=False))  # fmt: skip
        return
    shown = e.output if e.ok else e.detail
    shown = (shown or "").replace("\n", " ")
    shown = shown if len(shown) <= 70 else shown[:67] + "..."
    print(f"{v.verdict:<8} {e.status:<16} {v.record.id:<24} {shown}")


#: Subcommands: name -> (argument dataclass, function taking it and returning an exit status).
COMMANDS: dict[str, tuple[type, Callable[[Any], int]]] = {"verify": (VerifyArgs, verify)}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``populora`` console script."""
    parsed = tyro.extras.subcommand_cli_from_dict(
        {name: spec[0] for name, spec in COMMANDS.items()},
        args=argv,
        description="populora-env: teacher/student self-play with verifiable rewards.",
    )
    for _, (kind, run) in COMMANDS.items():
        if isinstance(parsed, kind):
            return run(parsed)
    raise AssertionError(f"unhandled command {parsed!r}")


if __name__ == "__main__":
    sys.exit(main())
