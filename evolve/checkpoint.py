"""Checkpoint files: atomic writes (temp file, fsync, rename) and SHA-256-checked reads.

File layout: a magic line, a JSON header line (format version, generation, payload length and SHA-256),
then the payload (``torch.save`` of plain containers, tensors and numbers; read back with
``weights_only=True``, so a checkpoint cannot run code). A file whose magic, header, length or checksum
is wrong raises ``CheckpointError`` naming the file: it is never loaded.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

MAGIC = b"POPULORA-EVOLVE-CHECKPOINT\n"
FORMAT_VERSION = 1
_NAME = re.compile(r"^gen_(\d{6,})\.ckpt$")  # (seven digits from generation 1 000 000 on)


class CheckpointError(RuntimeError):
    """A checkpoint that is corrupt, truncated or of another format (the message names the file)."""


DELETE_IT = "delete it to resume from an older one (the run starts over where there is none)"


def checkpoint_path(directory: Path, generation: int) -> Path:
    """The file of the checkpoint taken after ``generation`` generations."""
    return directory / f"gen_{generation:06d}.ckpt"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsyncs every file and folder under ``root`` (``root`` too), so that a rename publishing ``root``
    (and a manifest naming it) cannot outlive, on a power loss, the data it publishes."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(Path(folder) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(folder))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically: a temp file in the same folder, fsync, rename, fsync folder.

    A crash at any point leaves either the old file (or none) or the complete new one, plus at most a
    stray ``*.tmp`` file that readers ignore; a failed write (a full disk) removes its temp file and
    raises naming ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:  # a full disk: the partial file would keep it full
        tmp.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:  # ENOSPC from write() names no file
            error.filename = str(path)
        raise
    _fsync_dir(path.parent)


def save_checkpoint(directory: Path, generation: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Writes ``state`` as the checkpoint of ``generation`` and prunes all but the newest ``keep``.

    Returns:
        The checkpoint's path.

    Raises:
        CheckpointError: ``state`` holds values a checkpoint cannot load back safely (say, numpy arrays or
            a NumPy random state in a learner's ``state_dict``); nothing is written.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    try:  # what cannot be read back would only fail at the resume, a run later: refuse it now
        torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"cannot checkpoint generation {generation} in {directory}: the state holds values that "
            "torch.load(weights_only=True) refuses (a policy's or learner's state_dict must hold only "
            "tensors, numbers, strings, None and lists/tuples/dicts of them; store a NumPy array as a "
            f"tensor or a list): {_reason(error)}"
        ) from None
    header = {
        "format": FORMAT_VERSION,
        "generation": generation,
        "length": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    path = checkpoint_path(directory, generation)
    atomic_write_bytes(path, MAGIC + json.dumps(header).encode() + b"\n" + payload)
    prune_checkpoints(directory, keep)
    return path


def prune_checkpoints(directory: Path, keep: int) -> None:
    """Deletes all but the newest ``keep`` checkpoints."""
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)


def checkpoint_generation(path: Path) -> int:
    """The generation a checkpoint file is named for (``gen_000012.ckpt``: 12); ValueError for another name."""
    match = _NAME.match(path.name)
    if match is None:
        raise ValueError(f"{path.name} is not a checkpoint's name (gen_NNNNNN.ckpt)")
    return int(match.group(1))


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint files in ``directory``, oldest first (temp files excluded)."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if _NAME.match(p.name)), key=checkpoint_generation)


def remove_temp_files(directory: Path, names: Sequence[str] | None = None) -> list[Path]:
    """Deletes the temp files ``atomic_write_bytes`` left in ``directory`` when killed; returns them.

    Args:
        names: Only the temp files of these target names (``"config.json"`` matches
            ``.config.json.<pid>.tmp``); ``None``: every ``*.tmp`` file (a folder that is all ours).
    """
    if not directory.is_dir():
        return []
    pattern = None if names is None else re.compile(rf"\.({'|'.join(map(re.escape, names))})\.\d+\.tmp")
    stale = [
        p
        for p in directory.iterdir()
        if p.name.endswith(".tmp") and (pattern is None or pattern.fullmatch(p.name))
    ]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Reads and verifies a checkpoint.

    Raises:
        CheckpointError: not a readable file, wrong magic, unreadable header, wrong length (truncated) or
            wrong SHA-256.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as error:  # (a folder of a checkpoint's name was a raw IsADirectoryError: a review)
        raise CheckpointError(
            f"{path}: cannot be read ({error.strerror or error}); move it away to resume"
        ) from None
    if not data.startswith(MAGIC):
        raise CheckpointError(f"{path}: not a populora evolve checkpoint (bad magic); {DELETE_IT}")
    end = data.find(b"\n", len(MAGIC))
    try:
        header = json.loads(data[len(MAGIC) : end])
        length, digest = int(header["length"]), str(header["sha256"])
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{path}: unreadable header ({error}); {DELETE_IT}") from error
    if header.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format {header.get('format')!r}, expected {FORMAT_VERSION}")
    payload = data[end + 1 :]
    if len(payload) != length:
        raise CheckpointError(
            f"{path}: truncated or padded payload ({len(payload)} bytes, header says {length}); {DELETE_IT}"
        )
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(f"{path}: checksum mismatch (corrupt payload); {DELETE_IT}")
    try:
        state = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as error:  # intact bytes of a state this version refuses to unpickle
        raise CheckpointError(f"{path}: cannot be loaded safely: {_reason(error)}") from None
    if isinstance(state, dict) and "generation" in state and header.get("generation") != state["generation"]:
        raise CheckpointError(  # the payload is intact, so the header was edited (or written by other code)
            f"{path}: the header says generation {header.get('generation')!r}, the state it checksums "
            f"{state['generation']!r} (an edited header); {DELETE_IT}"
        )
    return state


def _reason(error: Exception) -> str:
    """The line of an unpickling error that says what was refused (torch's message runs to a page of
    advice, part of it to load the file unsafely), else its first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
    unpickler = [line for line in lines if line.startswith("WeightsUnpickler error:")]
    line = unpickler[0].split(". ", 1)[0] if unpickler else lines[0]  # the refused global, no advice
    return f"{type(error).__name__}: {line}"[:300]


def load_latest(directory: Path) -> dict[str, Any] | None:
    """The newest checkpoint in ``directory`` (verified), or ``None`` if there is none.

    A corrupt newest checkpoint raises ``CheckpointError``; older ones are never silently used instead.
    """
    found = list_checkpoints(directory)
    if not found:
        return None
    state = load_checkpoint(found[-1])
    named = checkpoint_generation(found[-1])
    if isinstance(state, dict) and "generation" in state and state["generation"] != named:
        raise CheckpointError(
            f"{found[-1]}: holds the state after generation {state['generation']}, not {named} as its name "
            "says (a renamed or copied file); move it away to resume from an older one"
        )
    return state
