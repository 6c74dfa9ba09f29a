"""Checking files of ``{"code", "input"[, "output"]}`` records (the CRUXEval/AZR format) in bulk."""

from __future__ import annotations

import codecs
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

from .literals import LiteralError, outputs_equal, parse_literal
from .records import Execution
from .verifier import Verifier

__all__ = ["LoadError", "Record", "RecordVerdict", "Summary", "load_records", "summarize", "verify_records"]


@dataclass(frozen=True)
class Record:
    """One program with one input and, optionally, the output it claims.

    Attributes:
        id: The record's ``id`` field, or ``"line N"``.
        code: Program source defining ``def f``.
        input: Argument-list text of the call.
        output: Claimed output literal text, or ``None``.
        line: The record's line number in its file (1 is the first), or 0 for a record made in code.
    """

    id: str
    code: str
    input: str
    output: str | None = None
    line: int = 0


@dataclass(frozen=True)
class LoadError:
    """A line of the file that is not a valid record (it is reported, the others are still checked)."""

    line: int
    reason: str


@dataclass(frozen=True)
class RecordVerdict:
    """The verdict for one record.

    Attributes:
        record: The record.
        execution: What running ``f(input)`` gave.
        verdict: ``"pass"`` (ran, and matched the claimed output), ``"ran"`` (ran to a plain value; the
            record claims no output, so nothing was compared), ``"mismatch"`` (ran, other output), or
            ``"error"`` (did not run to a plain value).
        reason: For a ``"mismatch"``, what differs: the output and the claim, or why the claim could not be
            a match whatever the output (not a literal; longer than the verifier's ``max_literal_chars``);
            "" otherwise.
    """

    record: Record
    execution: Execution
    verdict: Literal["pass", "ran", "mismatch", "error"]
    reason: str = ""


@dataclass(frozen=True)
class Summary:
    """Counts over a checked file."""

    records: int
    passed: int
    mismatched: int
    errors: int
    malformed_lines: int
    statuses: dict[str, int] = field(default_factory=dict)
    ran: int = 0  # records that claim no output and ran to a plain value (counted apart from ``passed``)


def load_records(path: str | os.PathLike[str]) -> tuple[list[Record], list[LoadError]]:
    """Reads a JSONL file (``"-"``: standard input; a pipe such as ``/dev/stdin`` works too); malformed
    lines, including lines that are not UTF-8, become :class:`LoadError` entries instead of exceptions.

    Raises:
        FileNotFoundError: The file does not exist (the message names it).
        IsADirectoryError: ``path`` is a folder.
    """
    if os.fspath(path) == "-":
        return _read_lines(sys.stdin.buffer)
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a JSONL file")
    if not path.exists():
        raise FileNotFoundError(f"no such JSONL file: {path}")
    with path.open("rb") as f:
        return _read_lines(f)


def _lines(f: BinaryIO) -> Iterator[bytes]:
    """The lines of a binary file as text mode splits them (universal newlines: ``\n``, ``\r\n``, ``\r``),
    except that a line holding a lone ``\r`` that parses as JSON whole stays one line: JSON takes a raw
    ``\r`` as whitespace between tokens (red-team round 33: such a record was split into two "not JSON")."""
    for raw in f:
        body = raw[:-2] if raw.endswith(b"\r\n") else raw.rstrip(b"\n")
        if b"\r" in body and not _parses(body):
            yield from body.split(b"\r")
        else:
            yield body


def _parses(body: bytes) -> bool:
    try:
        json.loads(body.removeprefix(codecs.BOM_UTF8))
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        return False
    return True


class _Fields(dict[str, Any]):
    """A JSON object that remembers the keys it was given more than once (``json``'s own dict keeps the last)."""

    repeated: list[str]


def _object(pairs: list[tuple[str, Any]]) -> _Fields:
    fields = _Fields(pairs)
    fields.repeated = [key for key, n in Counter(key for key, _ in pairs).items() if n > 1]
    return fields


def _read_lines(f: BinaryIO) -> tuple[list[Record], list[LoadError]]:
    records: list[Record] = []
    errors: list[LoadError] = []
    for number, raw in enumerate(_lines(f), start=1):
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        try:
            line = raw.decode("utf-8")  # strictly: a replaced byte would check another program
        except UnicodeDecodeError as e:
            errors.append(LoadError(number, f"not UTF-8: byte {raw[e.start]:#04x} at column {e.start + 1}"))
            continue
        if not line.strip():
            continue
        record = _parse_line(line, number)
        if isinstance(record, Record):
            records.append(record)
        else:
            errors.append(record)
    return records, errors


def _parse_line(line: str, number: int) -> Record | LoadError:
    try:
        data = json.loads(line, object_pairs_hook=_object)
    except ValueError as e:
        return LoadError(number, f"not JSON: {e}")
    except RecursionError:  # json's decoder recurses per bracket: ~1 000 of them in any field
        return LoadError(number, "not JSON this reader takes: nested too deeply")
    if not isinstance(data, dict):
        return LoadError(number, "not a JSON object")
    repeated = [key for key in getattr(data, "repeated", ()) if key in ("code", "input", "output", "id")]
    if repeated:  # which one was meant is not ours to guess (json keeps the last)
        return LoadError(number, f"field {repeated[0]!r} is given more than once")
    for key in ("code", "input"):
        if not isinstance(data.get(key), str):
            return LoadError(number, f"field {key!r} is missing or not a string")
    output = data.get("output")
    if output is not None and not isinstance(output, str):
        return LoadError(number, "field 'output' is not a string")
    given = data.get("id")
    if given is not None and type(given) not in (str, int):  # (a list was shown as its repr; an audit)
        return LoadError(number, "field 'id' is not a string or an integer")
    return Record(
        f"line {number}" if given is None else str(given), data["code"], data["input"], output, number
    )


def verify_records(
    verifier: Verifier, records: list[Record], *, expression_inputs: bool = False, batch_size: int = 256
) -> Iterator[RecordVerdict]:
    """Runs every record (in parallel batches) and yields verdicts in order.

    Args:
        verifier: An open verifier.
        records: Records to check.
        expression_inputs: Evaluate inputs as expressions in the sandbox (datasets such as CRUXEval
            whose inputs include calls like ``dict(a=1)``); by default inputs must be literals.
        batch_size: Records sent to the workers at once.
    """
    for start in range(0, len(records), batch_size):
        batch = records[start : start + batch_size]
        executions = verifier.run_many([(r.code, r.input) for r in batch], expression_args=expression_inputs)
        for record, execution in zip(batch, executions):
            yield _verdict(verifier, record, execution)


def _verdict(verifier: Verifier, record: Record, execution: Execution) -> RecordVerdict:
    if not execution.ok:
        return RecordVerdict(record, execution, "error")
    if record.output is None:
        return RecordVerdict(record, execution, "ran")
    cap = verifier.config.max_literal_chars
    if outputs_equal(execution.output or "", record.output, max_chars=cap):
        return RecordVerdict(record, execution, "pass")
    claimed = record.output
    if len(claimed) > cap:
        reason = f"the claimed output is longer than max_literal_chars ({len(claimed)} > {cap})"
    else:
        try:
            parse_literal(claimed, max_chars=cap)
        except (LiteralError, TypeError) as error:
            # ("value nests too deeply" read "the claimed output is value nests ..."; an audit)
            text = str(error)
            reason = "the claimed output " + (
                text.removeprefix("value ") if text.startswith("value ") else f"is {text}"
            )
        else:
            reason = f"returned {execution.output}, claimed {claimed}"
    return RecordVerdict(record, execution, "mismatch", reason)


def summarize(verdicts: list[RecordVerdict], errors: list[LoadError]) -> Summary:
    """Counts verdicts and statuses."""
    kinds = Counter(v.verdict for v in verdicts)
    return Summary(
        records=len(verdicts),
        passed=kinds["pass"],
        ran=kinds["ran"],
        mismatched=kinds["mismatch"],
        errors=kinds["error"],
        malformed_lines=len(errors),
        statuses=dict(Counter(v.execution.status for v in verdicts)),
    )
