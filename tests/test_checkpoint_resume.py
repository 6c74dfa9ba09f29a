"""Checkpoints: atomic writes, checksums, and exact resume after real SIGKILLs of a PBT subprocess."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from evolve import pbt
from evolve.checkpoint import (
    CheckpointError,
    atomic_write_bytes,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    save_checkpoint,
)
from evolve.learners import LEARNERS, ReinforceLearner
from evolve.pbt import PBTConfig, run_pbt
from populora_env.game import TeacherStudentConfig

ROOT = Path(__file__).resolve().parents[1]
GENERATIONS = 5

# The child runs the same tiny PBT; KILL_AT_WRITE=n makes it SIGKILL itself during its n-th checkpoint
# write, after the temp file is complete and before the rename (the worst moment for a torn checkpoint).
CHILD = """
import os, signal, sys
sys.path.insert(0, {root!r})
from tests.test_checkpoint_resume import tiny_config
from evolve import checkpoint
from evolve.pbt import run_pbt

kill_at = int(os.environ.get("KILL_AT_WRITE", "0"))
real_replace = os.replace
calls = [0]

def replace(src, dst):
    if str(dst).endswith(".ckpt"):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)

checkpoint.os.replace = replace
from evolve import pbt
real_run_generation = pbt.run_generation
def run_generation(population, backend, config, generation):
    print(generation, flush=True)  # the generations this process runs: a resume must not start over
    return real_run_generation(population, backend, config, generation)
pbt.run_generation = run_generation
run_pbt(tiny_config(sys.argv[1]))
"""


def tiny_config(run_dir: str, generations: int = GENERATIONS) -> PBTConfig:
    """2x2 torch teachers and students, four members per role, a few seconds per run."""
    env = TeacherStudentConfig(mode="structured", n_teachers=2, n_students=2, rounds=1, n_slots=3)
    return PBTConfig(
        run_dir=run_dir, seed=3, generations=generations, episodes_per_generation=2, env=env, population=4,
        pfsp=True, progress=False, tensorboard=False,
    )  # fmt: skip


def _child(tmp_path: Path, run_dir: Path, kill_at_write: int = 0) -> subprocess.Popen[bytes]:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(root=str(ROOT)))
    env = {**os.environ, "KILL_AT_WRITE": str(kill_at_write)}
    return subprocess.Popen(
        [sys.executable, str(script), str(run_dir)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _generations_run(proc: subprocess.Popen[bytes]) -> list[int]:
    assert proc.stdout is not None
    return [int(line) for line in proc.stdout.read().split()]


def record_generations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The generations ``run_pbt`` runs in this process from now on (a resume must not start over)."""
    ran: list[int] = []
    real_run_generation = pbt.run_generation

    def spy(population: Any, backend: Any, config: Any, generation: int) -> Any:
        ran.append(generation)
        return real_run_generation(population, backend, config, generation)

    monkeypatch.setattr(pbt, "run_generation", spy)
    return ran


def _newest(ckpts: Path) -> int:
    return int(list_checkpoints(ckpts)[-1].name[4:10])


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            assert proc.stderr is not None
            raise AssertionError(
                f"child exited early ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.02)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def _assert_same_run(a: Path, b: Path, generations: int = GENERATIONS) -> None:
    for name in ("metrics.jsonl", "lineage.jsonl", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    final_a = load_latest(a / "checkpoints")
    final_b = load_latest(b / "checkpoints")
    assert final_a is not None and final_b is not None
    assert final_a["generation"] == final_b["generation"] == generations
    for key in ("config", "next_id", "ratings", "rng", "history", "lineage", "buffer"):
        assert final_a[key] == final_b[key], key
    assert torch.equal(final_a["torch_rng"], final_b["torch_rng"])
    for role, members in final_a["groups"].items():
        for ma, mb in zip(members, final_b["groups"][role], strict=True):
            assert ma["id"] == mb["id"]
            if ma["genome"] is None:  # a scripted member
                assert mb["genome"] is None
                continue
            assert ma["genome"].keys() == mb["genome"].keys()
            assert all(torch.equal(ma["genome"][k], mb["genome"][k]) for k in ma["genome"])
            assert repr(ma["learner"]) == repr(mb["learner"])


@pytest.mark.slow
def test_sigkilled_run_resumes_bit_identical(tmp_path: Path) -> None:
    reference = run_pbt(tiny_config(str(tmp_path / "reference")))
    history = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == GENERATIONS and any(h["lineage"] for h in history)

    run = tmp_path / "killed"
    ckpts = run / "checkpoints"
    # 1. SIGKILL right after the first checkpoint lands (mid generation 2)
    proc = _child(tmp_path, run)
    _wait_for(ckpts / "gen_000001.ckpt", proc)
    _kill(proc)
    # 2. SIGKILL inside the next checkpoint write: a complete temp file, no rename
    start = _newest(ckpts)
    proc = _child(tmp_path, run, kill_at_write=1)
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert _generations_run(proc) == [start]  # resumed where the checkpoint left off, not from 0
    assert any(p.name.endswith(".tmp") for p in ckpts.iterdir())
    newest = list_checkpoints(ckpts)[-1].name
    # 3. SIGKILL a little after a later checkpoint, mid generation
    proc = _child(tmp_path, run)
    later = ckpts / f"gen_{int(newest[4:10]) + 1:06d}.ckpt"
    _wait_for(later, proc)
    time.sleep(0.3)
    if proc.poll() is None:
        _kill(proc)
    # 4. run to the end
    start = _newest(ckpts)
    proc = _child(tmp_path, run)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
    assert start > 0 and _generations_run(proc) == list(range(start, GENERATIONS))
    assert not any(p.name.endswith(".tmp") for p in ckpts.iterdir())
    _assert_same_run(reference, run)
    # a finished run re-run is a no-op that returns the same folder
    assert run_pbt(tiny_config(str(run))) == run
    _assert_same_run(reference, run)


@pytest.mark.slow
def test_a_finished_run_extended_equals_an_uninterrupted_longer_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 generations, then the same folder with generations=5: bit-identical to a 5-generation run (the
    finished run's last generation skipped its replacement; the extension makes it up)."""
    reference = run_pbt(tiny_config(str(tmp_path / "reference")))
    run = run_pbt(tiny_config(str(tmp_path / "extended"), generations=3))
    ran = record_generations(monkeypatch)
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["generation"] == 2 and last["lineage"] == []  # no children after a run's last generation
    with pytest.raises(ValueError, match=r"generations: .* not shortened"):
        run_pbt(tiny_config(str(run), generations=2))
    assert run_pbt(tiny_config(str(run))) == run
    assert ran == [3, 4]  # the extension ran only the new generations
    _assert_same_run(reference, run)
    assert run_pbt(tiny_config(str(run))) == run and ran == [3, 4]  # a finished run re-run runs nothing
    with pytest.raises(ValueError, match="another config"):  # other fields still have to match
        run_pbt(dataclasses.replace(tiny_config(str(run), generations=6), seed=4))


def test_checkpoint_roundtrip_and_pruning(tmp_path: Path) -> None:
    for generation in range(1, 5):
        save_checkpoint(tmp_path, generation, {"g": generation, "t": torch.arange(3)}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["gen_000003.ckpt", "gen_000004.ckpt"]
    state = load_latest(tmp_path)
    assert state is not None and state["g"] == 4 and torch.equal(state["t"], torch.arange(3))
    assert load_latest(tmp_path / "missing") is None


def test_checkpoints_past_generation_999_999_are_found(tmp_path: Path) -> None:
    """Names have seven digits from generation 1 000 000 on, and the listing took six only: the newest was
    invisible, a resume went back to the one before, and pruning never removed it (an audit)."""
    for generation in (999_999, 1_000_000, 1_000_001):
        save_checkpoint(tmp_path, generation, {"generation": generation}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["gen_1000000.ckpt", "gen_1000001.ckpt"]
    state = load_latest(tmp_path)
    assert state is not None and state["generation"] == 1_000_001


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[:-7], "truncated"),
        (lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]), "checksum"),
        (lambda data: b"garbage" + data, "bad magic"),
        (lambda data: data[: data.index(b"\n") + 3], "header"),
    ],
)
def test_corrupt_checkpoint_is_reported_not_loaded(tmp_path: Path, damage, message: str) -> None:
    path = save_checkpoint(tmp_path, 1, {"g": 1})
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match=rf"{message}.*; delete it to resume from an older one"):
        load_checkpoint(path)


def test_run_pbt_refuses_a_corrupt_latest_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    path = save_checkpoint(run_dir / "checkpoints", 1, {"g": 1})
    save_checkpoint(run_dir / "checkpoints", 2, {"g": 2})
    newest = list_checkpoints(run_dir / "checkpoints")[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CheckpointError, match=r"gen_000002\.ckpt"):
        run_pbt(tiny_config(str(run_dir)))
    assert path.exists()


def test_a_state_that_cannot_be_loaded_back_is_refused_when_saved(tmp_path: Path) -> None:
    """A learner whose state_dict holds a NumPy random state: torch.save accepts it, the safe load refuses
    it, so the first checkpoint fails with a CheckpointError naming the cause (and writes no file)
    instead of a resume failing a run later; a checkpoint file holding such a state (intact bytes) is a
    CheckpointError too, not a raw unpickling error."""

    class NumpyStateLearner(ReinforceLearner):
        def state_dict(self) -> dict[str, Any]:
            return {"inner": super().state_dict(), "rng": np.random.RandomState(0).get_state()}

    numpy_state = {"rng": np.random.RandomState(0).get_state()}
    with pytest.raises(CheckpointError, match=r"state_dict must hold only tensors.*numpy"):
        save_checkpoint(tmp_path / "direct", 1, numpy_state)
    assert list_checkpoints(tmp_path / "direct") == []
    LEARNERS["numpy-state"] = NumpyStateLearner
    try:
        config = dataclasses.replace(tiny_config(str(tmp_path / "run"), generations=2), learner="numpy-state")
        with pytest.raises(CheckpointError, match="cannot checkpoint generation 1"):
            run_pbt(config)
    finally:
        del LEARNERS["numpy-state"]
    assert list_checkpoints(tmp_path / "run" / "checkpoints") == []
    buffer = io.BytesIO()
    torch.save(numpy_state, buffer)
    path = save_checkpoint(tmp_path / "forged", 1, {"g": 1})
    payload = buffer.getvalue()
    header = {
        "format": 1,
        "generation": 1,
        "length": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    path.write_bytes(
        b"POPULORA-EVOLVE-CHECKPOINT\n" + json.dumps(header).encode() + b"\n" + buffer.getvalue()
    )
    with pytest.raises(CheckpointError, match=r"cannot be loaded safely.*numpy"):
        load_checkpoint(path)


def test_how_often_a_run_checkpoints_is_not_part_of_its_identity(tmp_path: Path) -> None:
    """checkpoint_every changes no result (resume is exact from any checkpoint): a run extended with
    another value goes on (it was refused as "another config"), also from checkpoints that still hold
    the field in their config."""
    run = tmp_path / "run"
    run_pbt(tiny_config(str(run), generations=2))
    config = dataclasses.replace(tiny_config(str(run), generations=3), checkpoint_every=2)
    assert "checkpoint_every" not in config.fingerprint()
    run_pbt(config)
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    older = {"config": json.dumps({**config.fingerprint(), "checkpoint_every": 5, "generations": 3})}
    assert pbt._check_same_run(older, config, run / "checkpoints" / "gen_000003.ckpt") == 3


def test_the_start_of_another_run_without_a_checkpoint_is_not_replaced(tmp_path: Path) -> None:
    """A folder holding a run's config.json and metrics but no checkpoint (killed before the first one,
    e.g. with checkpoint_every > 1): another config is refused and the folder left as it was; the same
    config starts that run over and ends as it would have."""
    run = tmp_path / "run"
    run_pbt(tiny_config(str(run), generations=2))
    metrics = (run / "metrics.jsonl").read_bytes()
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(ValueError, match=r"start of a run with another config \(fields \['seed'\]"):
        run_pbt(dataclasses.replace(tiny_config(str(run), generations=2), seed=5))
    assert (run / "metrics.jsonl").read_bytes() == metrics
    run_pbt(tiny_config(str(run), generations=2))
    assert (run / "metrics.jsonl").read_bytes() == metrics


def test_a_run_folder_in_the_way_is_refused_before_any_work(tmp_path: Path) -> None:
    """A config.json that is JSON but no config (it was an AttributeError), and a file where the
    checkpoints go (found only when the first generation was saved, after its work)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("[]")
    with pytest.raises(ValueError, match=r"config\.json is not a run config \(a JSON list\)"):
        run_pbt(tiny_config(str(run)))
    (run / "config.json").unlink()
    (run / "checkpoints").write_text("")
    with pytest.raises(ValueError, match=r"checkpoints is a file, not a folder"):
        run_pbt(tiny_config(str(run)))
    assert sorted(p.name for p in run.iterdir()) == [pbt.LOCK_FILE, "checkpoints"]  # the lock of the first
    # a file where TensorBoard writes, a folder in the lock file's place (errno texts naming neither; an audit)
    (run / "checkpoints").unlink()
    (run / "tb").write_text("")
    with pytest.raises(
        ValueError, match=r"tb is a file, not a folder: the run's TensorBoard scalars go there"
    ):
        run_pbt(dataclasses.replace(tiny_config(str(run)), tensorboard=True))
    (run / "tb").unlink()
    (run / pbt.LOCK_FILE).unlink()
    (run / pbt.LOCK_FILE).mkdir()
    with pytest.raises(ValueError, match=r"\.lock is a folder, not the run's lock file: remove it"):
        run_pbt(tiny_config(str(run)))


def test_a_folder_holding_other_files_a_run_would_replace_is_refused(tmp_path: Path) -> None:
    """Without a config.json or checkpoint, its metrics.jsonl, lineage.jsonl and curves.png were replaced
    without a word (``--run-dir .`` in a project folder)."""
    for name in ("metrics.jsonl", "curves.png"):
        run = tmp_path / name
        run.mkdir()
        (run / name).write_text("precious")
        with pytest.raises(ValueError, match=rf"holds {name} but no run config or checkpoint, and a new run"):
            run_pbt(tiny_config(str(run)))
        assert sorted(p.name for p in run.iterdir()) == [name]  # not even a lock file
        assert (run / name).read_text() == "precious"


def test_a_run_folder_is_one_runs_at_a_time(tmp_path: Path) -> None:
    """Two runs on one folder (two ``populora train`` with the same --run-dir) both "succeeded", every
    metric written twice. The folder is locked for the run; a killed run's lock goes with its process."""
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(run / pbt.LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'4242'); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(pbt.RunInUseError, match=r"run is in use by another run \(pid 4242\)"):
            run_pbt(tiny_config(str(run), generations=1))
        assert sorted(p.name for p in run.iterdir()) == [pbt.LOCK_FILE]  # nothing of the run written
    finally:
        holder.kill()
        holder.wait()
    run_pbt(tiny_config(str(run), generations=1))  # the kill released it
    with pbt._run_lock(run), pytest.raises(pbt.RunInUseError, match=f"pid {os.getpid()}"):
        run_pbt(tiny_config(str(run), generations=1))  # in this process too


def test_a_write_that_fails_names_its_file_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC from ``write()`` names no file, and the partial temp file kept the disk full."""
    import errno

    def full(handle: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match=r"No space left on device: '.*x\.bin'"):
        atomic_write_bytes(tmp_path / "x.bin", b"abc")
    assert list(tmp_path.iterdir()) == []


def test_a_run_folder_tensorboard_cannot_name_is_refused_before_any_write(tmp_path: Path) -> None:
    run = os.fsdecode(os.fsencode(tmp_path) + b"/bad\xffdir")
    with pytest.raises(ValueError, match=r"is not UTF-8, which TensorBoard's writer needs"):
        run_pbt(dataclasses.replace(tiny_config(run), tensorboard=True))
    assert not os.path.exists(run)


def test_resume_with_another_config_is_refused(tmp_path: Path) -> None:
    """The message names the nested values that differ (a base model's path moved with the cache, say)."""
    config = tiny_config(str(tmp_path / "run"))
    saved = {
        **config.fingerprint(),
        "seed": 99,
        "member_options": {"lora": {"base": "/old/cache/base", "rank": 2}},
    }
    save_checkpoint(tmp_path / "run" / "checkpoints", 1, {"config": json.dumps(saved)})
    for generation in (2, 3):  # (another run's checkpoints are left alone, whatever keep_checkpoints says)
        save_checkpoint(tmp_path / "run" / "checkpoints", generation, {"config": json.dumps(saved)}, keep=5)
    with pytest.raises(ValueError, match="another config") as refused:
        run_pbt(dataclasses.replace(config, keep_checkpoints=1))
    assert len(list((tmp_path / "run" / "checkpoints").iterdir())) == 3
    assert "fields ['member_options', 'seed'] differ: member_options.lora: saved" in str(refused.value)
    assert '"/old/cache/base"' in str(refused.value) and "seed: saved 99, now 3" in str(refused.value)


def test_atomic_write_leaves_no_temp_file(tmp_path: Path) -> None:
    atomic_write_bytes(tmp_path / "x.bin", b"abc")
    atomic_write_bytes(tmp_path / "x.bin", b"def")
    assert (tmp_path / "x.bin").read_bytes() == b"def"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


class _Killed(BaseException):
    """Stands for a SIGKILL at one point of a run (nothing after it runs in that process)."""


def test_a_kill_between_a_checkpoint_and_its_log_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after generation 1's checkpoint was written but before its metrics were logged: the resume
    (which has no generation left to play) logs it all the same, TensorBoard included; temp files a killed
    write left in the run folder go (and only those), and so do checkpoints beyond ``keep_checkpoints``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from evolve.runlog import RunLog

    def config(run_dir: Path) -> PBTConfig:
        return dataclasses.replace(tiny_config(str(run_dir), generations=2), tensorboard=True)

    reference = run_pbt(config(tmp_path / "reference"))
    append = RunLog.append

    def killed_at_the_second(self: RunLog, record: Any) -> None:
        if record.generation == 1:
            raise _Killed
        append(self, record)

    monkeypatch.setattr(RunLog, "append", killed_at_the_second)
    run_dir = tmp_path / "run"
    with pytest.raises(_Killed):
        run_pbt(config(run_dir))
    monkeypatch.setattr(RunLog, "append", append)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
    stray = [run_dir / ".config.json.12345.tmp", run_dir / ".metrics.jsonl.12345.tmp"]
    for path in stray:
        path.write_text("half")
    (run_dir / "notes.tmp").write_text("the user's")
    shutil.copy(run_dir / "checkpoints" / "gen_000001.ckpt", run_dir / "checkpoints" / "gen_000000.ckpt")

    run_pbt(config(run_dir))
    _assert_same_run(reference, run_dir, generations=2)
    assert not any(path.exists() for path in stray) and (run_dir / "notes.tmp").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "gen_000001.ckpt",
        "gen_000002.ckpt",
    ]

    def scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
        events = EventAccumulator(str(path / "tb"))
        events.Reload()
        return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}

    theirs, ours = scalars(reference), scalars(run_dir)
    assert ours == theirs and [step for step, _ in ours["env/solve_rate"]] == [0, 1]


@pytest.mark.parametrize("damage", ["garbage", "deleted", "another seed"])
def test_a_resumed_run_rewrites_a_damaged_config_json(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``config.json`` was written only for a new or extended run: a file damaged, deleted or edited since
    stayed so, unreported, though the README promises it byte for byte and ``populora train`` reads it."""
    import logging

    run_dir = tmp_path / "run"
    config = tiny_config(str(run_dir), generations=2)
    run_pbt(config)
    expected = (run_dir / "config.json").read_bytes()
    list_checkpoints(run_dir / "checkpoints")[-1].unlink()  # the resume has a generation to play
    path = run_dir / "config.json"
    if damage == "garbage":
        path.write_text("{not json")
    elif damage == "deleted":
        path.unlink()
    else:
        path.write_text(json.dumps({**json.loads(expected), "seed": 99}))
    with caplog.at_level(logging.WARNING, logger="evolve.pbt"):
        run_pbt(config)
    assert path.read_bytes() == expected
    assert any(str(path) in r.getMessage() and "rewritten" in r.getMessage() for r in caplog.records)


def test_a_checkpoint_whose_name_says_another_generation_is_refused(tmp_path: Path) -> None:
    """A copied or renamed checkpoint (``gen_000001`` copied to ``gen_000007``) was resumed from its
    content's generation while its name kept it the newest: every rerun of a finished run replayed."""
    run_dir = tmp_path / "run"
    run_pbt(tiny_config(str(run_dir), generations=2))
    checkpoints = run_dir / "checkpoints"
    shutil.copy(list_checkpoints(checkpoints)[0], checkpoints / "gen_000007.ckpt")
    with pytest.raises(CheckpointError, match=r"gen_000007\.ckpt: holds the state after generation 1, not 7"):
        run_pbt(tiny_config(str(run_dir), generations=2))


def test_a_folder_of_a_checkpoint_s_name_is_reported_naming_it(tmp_path: Path) -> None:
    """A folder named like the newest checkpoint was a raw IsADirectoryError (a review)."""
    run_dir = tmp_path / "run"
    run_pbt(tiny_config(str(run_dir), generations=1))
    (run_dir / "checkpoints" / "gen_000009.ckpt").mkdir()
    with pytest.raises(
        CheckpointError, match=r"gen_000009\.ckpt: cannot be read \(Is a directory\); move it away"
    ):
        run_pbt(tiny_config(str(run_dir), generations=2))


def test_a_file_system_without_locks_runs_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Some network and FUSE mounts refuse flock (ENOLCK): the run goes on, saying it is unprotected."""
    import errno

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(pbt.fcntl, "flock", no_locks)
    with caplog.at_level("WARNING", logger="evolve.pbt"):
        run = run_pbt(tiny_config(str(tmp_path / "run"), generations=1))
    assert load_latest(run / "checkpoints") is not None
    assert "cannot lock the run folder" in caplog.text and "No locks available" in caplog.text


def _edits() -> dict[str, Any]:
    def nan_genome(state: dict[str, Any]) -> None:
        genome = state["groups"]["teacher"][0]["genome"]
        genome[next(iter(genome))].view(-1)[0] = float("nan")

    def int64_genome(state: dict[str, Any]) -> None:
        genome = state["groups"]["teacher"][0]["genome"]
        key = next(iter(genome))
        genome[key] = genome[key].long()

    def twice(state: dict[str, Any]) -> None:
        state["groups"]["teacher"][1]["id"] = state["groups"]["teacher"][0]["id"]

    return {
        "a NaN genome": (nan_genome, r"not a state this run can resume \(ValueError: teacher member \d+'s genome has "
                         r"non-finite values"),
        "an id twice": (twice, r"not a state this run can resume \(ValueError: checkpoint gives member id \d+ twice"),
        "no rng": (lambda state: state.pop("rng"), r"not a state this run can resume \(KeyError: 'rng'\)"),
        "another role": (lambda state: state["groups"].update(wizard=[]), r"the roles \['student', 'teacher', 'wizard'\]"),
        "no config": (lambda state: state.pop("config"), r"holds no run config \(KeyError: 'config'\)"),
        "broken history": (lambda state: state.update(history="[{"), r"not a state this run can resume \(JSONDecodeError"),
        # (a review: each resumed; the next children took the first members' ids, metrics.jsonl held NaN or
        # lost its first generations, an int64 genome was cast)
        "next id 0": (lambda state: state.update(next_id=0), r"next member id is 0, but member \d+ exists already"),
        "a NaN rating": (lambda state: state.update(ratings=state["ratings"].replace("[", "[NaN, ", 1)),
                         r"checkpoint's ratings holds NaN, which no run writes"),
        "a zero sigma": (lambda state: state.update(ratings=json.dumps({k: [25.0, 0.0] for k in json.loads(state["ratings"])})),
                         r"checkpoint's rating of member \d+ has sigma 0.0"),
        "no history": (lambda state: state.update(history="[]"),
                       r"history holds 0 generations' records, its generation is 2"),
        "an int64 genome": (int64_genome, r"teacher member \d+'s genome holds '.*' as torch.int64, the member torch.float32"),
    }  # fmt: skip


@pytest.mark.parametrize("edit", sorted(_edits()))
def test_a_checkpoint_edited_and_saved_again_is_refused_naming_the_file(tmp_path: Path, edit: str) -> None:
    """Bytes that pass the checksum (edited, then written with ``save_checkpoint``) but hold no state of this
    run: a NaN genome and a member id given twice were resumed silently, a missing field was a bare KeyError
    naming no file (a robustness review). Each is a ``CheckpointError`` naming the file, loading nothing."""
    change, message = _edits()[edit]
    run_dir = tmp_path / "run"
    run_pbt(tiny_config(str(run_dir), generations=2))
    checkpoints = run_dir / "checkpoints"
    state = load_latest(checkpoints)
    assert state is not None
    change(state)
    path = save_checkpoint(checkpoints, 2, state)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}: .*{message}.*delete it to resume"):
        run_pbt(tiny_config(str(run_dir), generations=3))


def test_a_header_edited_to_another_generation_is_refused(tmp_path: Path) -> None:
    """The payload is checksummed, the header is not: a header that says another generation than its
    (intact) state was loaded as if it agreed."""
    path = save_checkpoint(tmp_path, 3, {"generation": 3, "t": torch.arange(2)})
    data = path.read_bytes()
    edited = data.replace(b'"generation": 3', b'"generation": 5', 1)
    assert edited != data
    path.write_bytes(edited)
    with pytest.raises(
        CheckpointError, match=r"gen_000003\.ckpt: the header says generation 5, the state it"
    ):
        load_checkpoint(path)
