"""The ``populora verify`` command, run as a user would: as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from populora_env.cli import main
from populora_env.verifier.jsonl import load_records

EXPECTED = {  # example id -> (verdict, status)
    "double": ("pass", "ok"), "reverse_words": ("pass", "ok"), "running_max": ("pass", "ok"),
    "count_chars": ("pass", "ok"), "gcd_pairs": ("pass", "ok"), "two_args": ("pass", "ok"),
    "big_int": ("ran", "ok"), "set_result": ("pass", "ok"), "unicode": ("pass", "ok"),
    "recursion": ("pass", "ok"), "wrong_claim": ("mismatch", "ok"), "syntax_error": ("error", "syntax"),
    "no_function_f": ("error", "syntax"), "forbidden_import": ("error", "forbidden"),
    "forbidden_dunder": ("error", "forbidden"), "infinite_loop": ("error", "timeout"),
    "memory_bomb": ("error", "memory"), "division_by_zero": ("error", "runtime"),
    "hash_order": ("error", "nondeterministic"), "returns_object": ("error", "bad_output"),
    "returns_nan": ("error", "bad_output"), "input_is_code": ("error", "bad_input"),
}  # fmt: skip


def populora(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "populora_env.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_verify_examples_json_gives_each_expected_verdict():
    done = populora("verify", "--examples", "--json", "--timeout", "1")
    assert done.returncode == 0, done.stderr
    assert "verifying" not in done.stderr  # no progress bar in a pipe (it was drawn there too; an audit)
    # no hint to evaluate the example set's input that is code: it is one of its hostile records (an audit)
    assert "--expression-inputs" not in done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    rows, summary = lines[:-1], lines[-1]
    assert {r["id"]: (r["verdict"], r["status"]) for r in rows} == EXPECTED
    assert (summary["summary"]["passed"], summary["summary"]["ran"], summary["summary"]["mismatched"]) == (
        9,
        1,
        1,
    )
    assert populora("verify", "--examples", "--strict", "--timeout", "1").returncode == 1


def test_verify_text_output_has_verdicts_and_summary(tmp_path):
    data = tmp_path / "mixed.jsonl"
    data.write_text(
        '{"code": "def f(x):\\n    return x + 1", "input": "1", "output": "2", "id": "good"}\n'
        "this line is not json\n"
        '{"code": 5, "input": "1"}\n'
        "\n"
        '{"code": "def f(a, b):\\n    return a * b", "input": "dict(a=1), 2", "id": "expr"}\n'
    )
    done = populora("verify", str(data))
    assert done.returncode == 0, done.stderr
    assert "good" in done.stdout and "pass" in done.stdout
    assert f"{data}:2: skipped: not JSON" in done.stderr
    assert f"{data}:3: skipped: field 'code' is missing or not a string" in done.stderr
    assert "pass 1  mismatch 0  error 1  malformed lines 2" in done.stdout
    # the one error is an input that is no literal: the message says which flag evaluates it
    assert "1 input(s) are not literals (such as dict(a=1)); --expression-inputs evaluates" in done.stderr
    assert "malformed node or string on line 1" in done.stdout  # (was "line 2" of a one-line input)
    expr = populora("verify", str(data), "--expression-inputs", "--json")
    lines = [json.loads(line) for line in expr.stdout.splitlines()[:-1]]
    # malformed lines are JSON on stdout too (they were text on stderr only; a review), in their place in the
    # file's order (they came first, before line 1's verdict)
    assert [row["line"] for row in lines] == [1, 2, 3, 5]
    assert lines[1:3] == [
        {"line": 2, "verdict": "malformed", "reason": lines[1]["reason"]},
        {"line": 3, "verdict": "malformed", "reason": "field 'code' is missing or not a string"},
    ] and lines[1]["reason"].startswith("not JSON")
    assert lines[3] == {"line": 5, "id": "expr", "verdict": "error", "status": "runtime", "output": None,
                        "claimed": None, "detail": lines[3]["detail"], "reason": ""}  # fmt: skip
    assert "unsupported operand" in lines[3]["detail"] and "not literals" not in expr.stderr


def test_a_mismatch_says_what_differs_and_a_record_without_output_is_counted_as_ran(tmp_path):
    """A review: a mismatch showed the output only, a claim that is no literal gave no reason, and a record
    that claims no output was counted as a pass although nothing was compared."""
    data = tmp_path / "claims.jsonl"
    code = "def f(x):\n    return [x, x + 1]"
    data.write_text("".join(json.dumps({"id": name, "code": code, "input": "1", **claim}) + "\n" for name, claim in (
        ("wrong", {"output": "[1,  3]"}), ("broken", {"output": "[1, 2"}), ("none", {}),
        ("right", {"output": "[1, 2]"}))))  # fmt: skip
    done = populora("verify", str(data), "--json")
    rows = {row["id"]: row for row in map(json.loads, done.stdout.splitlines()[:-1])}
    assert {name: (row["verdict"], row["claimed"]) for name, row in rows.items()} == {
        "wrong": ("mismatch", "[1,  3]"), "broken": ("mismatch", "[1, 2"), "none": ("ran", None),
        "right": ("pass", "[1, 2]")}  # fmt: skip
    assert rows["wrong"]["reason"] == "returned [1, 2], claimed [1,  3]"
    assert rows["broken"]["reason"].startswith("the claimed output is not valid Python: SyntaxError")
    assert rows["none"]["reason"] == rows["right"]["reason"] == ""
    summary = json.loads(done.stdout.splitlines()[-1])["summary"]
    assert (summary["passed"], summary["ran"], summary["mismatched"]) == (1, 1, 2)
    text = populora("verify", str(data), "--strict")
    assert "pass 1  ran 1 (no output claimed)  mismatch 2  error 0" in text.stdout and text.returncode == 1


def test_verify_missing_file_is_a_clear_error(tmp_path):
    done = populora("verify", str(tmp_path / "absent.jsonl"))
    assert done.returncode == 2
    assert "no such JSONL file" in done.stderr and "absent.jsonl" in done.stderr
    assert populora("verify").returncode == 2
    folder = populora("verify", str(tmp_path))
    assert folder.returncode == 2 and f"{tmp_path} is a folder, not a JSONL file" in folder.stderr
    for option, message in ((["--workers", "0"], "--workers must be an int in [1, 256], got 0"),
                            (["--workers", "100000"], "--workers must be an int in [1, 256], got 100000"),
                            (["--timeout", "-1"], "timeout must be > 0, got -1.0"),
                            (["--timeout", "inf"], "timeout must be at most 86400 s")):  # fmt: skip
        bad = populora("verify", "--examples", *option)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr


def test_load_records_reports_malformed_lines(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('[1, 2]\n{"code": "def f(): return 1", "input": "", "output": 3}\n')
    records, errors = load_records(data)
    assert records == []
    assert [(e.line, e.reason) for e in errors] == [
        (1, "not a JSON object"),
        (2, "field 'output' is not a string"),
    ]


def test_a_deeply_nested_line_is_skipped_and_the_others_checked(tmp_path):
    """``json.loads`` raises RecursionError on ~1 000 brackets (any extra field can hold them): the whole
    file was lost to a traceback, with --strict's exit status 1."""
    good = json.dumps({"code": "def f(x):\n    return x", "input": "1", "output": "1", "id": None})
    deep = '{"code": "def f(x):\\n    return x", "input": "1", "meta": ' + "[" * 5000 + "]" * 5000 + "}"
    data = tmp_path / "deep.jsonl"
    data.write_text(f"{good}\n{deep}\n{good}\n")
    records, errors = load_records(data)
    assert [r.id for r in records] == ["line 1", "line 3"]  # "id": null is no id, not "None"
    assert [(e.line, e.reason) for e in errors] == [(2, "not JSON this reader takes: nested too deeply")]
    done = populora("verify", str(data))
    assert done.returncode == 0 and "pass 2" in done.stdout and "Traceback" not in done.stderr


def test_a_claimed_output_over_the_literal_cap_says_so(tmp_path):
    """A claimed output equal in value but longer than ``max_literal_chars`` cannot match: the mismatch says
    why (it was reported with the output alone; red-team round 33)."""
    padded = tmp_path / "padded.jsonl"
    claim = "1" + " " * 20_000
    padded.write_text(
        json.dumps({"id": "pad", "code": "def f(x):\n    return x", "input": "1", "output": claim})
    )
    done = populora("verify", str(padded), "--json")
    row = json.loads(done.stdout.splitlines()[0])
    assert (row["verdict"], row["status"], row["output"]) == ("mismatch", "ok", "1")
    assert row["reason"].startswith("the claimed output is longer than max_literal_chars (20001 > ")
    assert "the claimed output is longer than max_literal_chars" in populora("verify", str(padded)).stdout


def test_strict_fails_a_file_with_no_records(tmp_path):
    """A truncated or empty dataset passed ``--strict`` (0 records, nothing failed)."""
    for text in ("", "\n\n"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text(text)
        done = populora("verify", str(empty), "--strict")
        assert done.returncode == 1 and "--strict: " in done.stderr and "holds no records" in done.stderr
        assert populora("verify", str(empty)).returncode == 0


def test_verify_refuses_bytes_that_are_not_utf8_and_prints_any_text(tmp_path):
    """An invalid byte was replaced by U+FFFD, so a program other than the file's ran (and passed
    --strict when its claimed output held U+FFFD); a lone surrogate in an id crashed the printing."""
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(
        b'{"code": "def f(x):\\n    return \\"\xff\\"", "input": "1", "output": "\\"\\ufffd\\""}\n'
    )
    records, errors = load_records(bad)
    assert records == [] and [(e.line, e.reason) for e in errors] == [
        (1, "not UTF-8: byte 0xff at column 35")
    ]
    done = populora("verify", str(bad), "--strict")
    assert done.returncode == 1 and "not UTF-8" in done.stderr and "pass 0" in done.stdout
    old_mac = tmp_path / "cr.jsonl"  # lines ended by a lone CR, as text mode read them
    old_mac.write_bytes(
        b'{"code": "def f(x):\\n    return x", "input": "1"}\r{"code": "def f(x):\\n    return x", "input": "2"}\r\n'
    )
    assert [r.input for r in load_records(old_mac)[0]] == ["1", "2"]
    # a lone CR inside one record is JSON whitespace, not a line break; a field given twice is refused
    # rather than resolved to the last (red-team round 33)
    inner = tmp_path / "inner_cr.jsonl"
    inner.write_bytes(b'{"code": "def f(x):\\n    return x",\r "input": "1"}\n')
    assert [(r.input, r.id) for r in load_records(inner)[0]] == [("1", "line 1")]
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"code": "def f(x):\\n    return x", "input": "1", "output": "1", "output": "2"}\n')
    assert [(e.line, e.reason) for e in load_records(twice)[1]] == [
        (1, "field 'output' is given more than once")
    ]
    bom = tmp_path / "bom.jsonl"  # a byte-order mark (Windows editors) is not a malformed line
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"code": "def f(x):\\n    return x", "input": "1", "output": "1"}\n')
    assert len(load_records(bom)[0]) == 1
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"id": "\\ud800", "code": "def f(x):\\n    return x", "input": "1", "output": "1"}\n')
    for extra in ([], ["--json"]):
        done = populora("verify", str(odd), *extra)
        assert done.returncode == 0 and "\\ud800" in done.stdout and "Traceback" not in done.stderr, (
            done.stderr
        )


def test_verify_text_output_escapes_control_characters(tmp_path):
    """A record's id and a program's error detail are the data's text: an ESC sequence and a carriage return
    went to the terminal as they were, and a runtime error's line read as a pass (a red-team review). They
    are escaped as Python writes them; ``--json`` keeps the text."""
    data = tmp_path / "ctl.jsonl"
    forged = "\r" + "pass     ok               line 1"
    record = {
        "id": "a\x1b[31mRED\x1b[0m\u202e",
        "code": f"def f(x):\n    raise ValueError({forged!r})",
        "input": "1",
    }
    data.write_text(json.dumps(record) + "\n")
    done = populora("verify", str(data))
    row = done.stdout.splitlines()[0]
    assert "\x1b" not in done.stdout and "\r" not in done.stdout and "\u202e" not in done.stdout
    assert row.startswith("error    runtime") and "a\\x1b[31mRED\\x1b[0m\\u202e" in row and "\\r" in row
    rows = [json.loads(line) for line in populora("verify", str(data), "--json").stdout.splitlines()[:-1]]
    assert rows[0]["id"] == record["id"] and "\r" in rows[0]["detail"]


def test_verify_reads_a_pipe_and_standard_input(tmp_path):
    line = '{"code": "def f(x):\\n    return x + 1", "input": "1", "output": "2"}\n'
    for path in ("-", "/dev/stdin"):
        done = subprocess.run([sys.executable, "-m", "populora_env.cli", "verify", path], input=line,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0 and "pass 1" in done.stdout, (path, done.stderr)


def test_verify_into_a_closed_pipe_exits_quietly():
    """`populora verify --examples | head -1`: the reader leaves; no BrokenPipeError traceback."""
    done = subprocess.run(
        f"{sys.executable} -m populora_env.cli verify --examples | head -1", shell=True, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert len(done.stdout.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr


def test_a_cache_dir_that_cannot_be_a_folder_is_named_with_what_is_there(tmp_path, capsys):
    """A file or a link to nothing at --cache-dir was `[Errno 17] File exists: '...'`, no word of the cache."""
    (tmp_path / "a-file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name, why in (
        ("a-file", "it is a file"),
        ("dangling", f"it is a link to nothing ({tmp_path / 'nowhere'})"),
    ):
        for command in (["base", "build"], ["train", "--run-dir", str(tmp_path / "run")]):
            assert main([*command, "--cache-dir", str(tmp_path / name)]) == 2
            err = capsys.readouterr().err
            assert f"the tiny-base cache folder {tmp_path / name} cannot be made: {why}" in err, err
    assert not (tmp_path / "run").exists()


def test_help_texts_are_not_broken_mid_sentence(capsys, monkeypatch):
    """tyro kept a field docstring's first line break: `--help` printed "...; raise it" and "on an existing
    --run-dir..." on two lines, at any width."""
    monkeypatch.setenv("COLUMNS", "400")
    for command, text in (
        ("train", "mutation); raise it on an existing --run-dir to extend that run."),
        ("train", "(built and cached on first use: a few CPU-minutes)"),
        ("train", "is bit-identical; --no-deterministic lets CUDA"),
        ("verify", "mismatches its claimed output, a line is malformed, or the file holds no records."),
    ):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert text in capsys.readouterr().out, (command, text)


def test_base_build_stopped_by_sigterm_leaves_nothing_in_the_cache(tmp_path, capsys, monkeypatch):
    """SIGTERM killed the build where it stood and left its staging folder in the cache (until the next
    build); it stops like Ctrl-C: the staging folder is removed, one line says so, status 143."""
    import signal

    import agents.base

    def terminated(out_dir, *args):
        (out_dir / "weights.partial").write_text("")
        os.kill(os.getpid(), signal.SIGTERM)

    def not_handled(signum, frame):  # (the default action would end pytest)
        raise AssertionError("SIGTERM reached the handler from before the build")

    monkeypatch.setattr(agents.base, "_build_into", terminated)
    before = signal.signal(signal.SIGTERM, not_handled)
    try:
        assert main(["base", "build", "--steps", "2", "--cache-dir", str(tmp_path)]) == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is not_handled
    finally:
        signal.signal(signal.SIGTERM, before)
    assert "populora base: stopped by SIGTERM (nothing was cached)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []

    def interrupted(out_dir, *args):  # Ctrl-C says the same (it read "populora base: interrupted"; an audit)
        raise KeyboardInterrupt

    monkeypatch.setattr(agents.base, "_build_into", interrupted)
    assert main(["base", "build", "--steps", "2", "--cache-dir", str(tmp_path)]) == 128 + signal.SIGINT
    assert "populora base: stopped by SIGINT (nothing was cached)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_base_build_caches_the_tiny_base_and_names_bad_values(tmp_path, capsys):
    """`populora base build` with a shortened pretraining: a Hugging Face model directory, reused from the
    cache on the second call; a bad value is exit status 2 naming the field."""
    args = ["base", "build", "--steps", "2", "--corpus-documents", "300", "--threads", "1",
            "--cache-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    built = Path(capsys.readouterr().out.strip())
    assert built.parent == tmp_path and (built / "config.json").is_file()
    assert list(built.glob("tokenizer*.json")) and list(built.glob("*.safetensors"))
    assert main(args) == 0 and Path(capsys.readouterr().out.strip()) == built  # from the cache
    assert main(["base", "build", "--steps", "0", "--cache-dir", str(tmp_path)]) == 2
    assert "steps" in capsys.readouterr().err
    assert main(["base", "build", "--seed", "-1", "--cache-dir", str(tmp_path)]) == 2  # as train's --seed
    assert "--seed must be an int >= 0, got -1" in capsys.readouterr().err
    # -1 was a RuntimeError traceback, 0 the default in silence, 100000 a SIGSEGV in the first product
    for threads in ("0", "-1", "100000"):
        assert main([*args[:-4], "--threads", threads, "--cache-dir", str(tmp_path)]) == 2
        cpus = os.cpu_count()
        assert f"threads must be an int from 1 to {cpus} (this machine's CPUs), got {threads}" in \
            capsys.readouterr().err  # fmt: skip


def test_rejection_shares_are_whole_percentages_and_a_rare_reason_is_not_zero():
    """A reason seen once in 300 proposals read "0%" in populora train's summary (a review)."""
    from populora_env.cli import _percent

    assert [_percent(n, 300) for n in (1, 2, 150, 300)] == ["<1%", "1%", "50%", "100%"]
    assert _percent(1, 200) == "<1%"  # (0.5% rounds to 0% half-to-even)


def test_base_build_errors_name_the_options(tmp_path, capsys):
    """``TinyBaseConfig.steps must be >= 1`` named a dataclass field the user never wrote (an audit)."""
    for option, value in (("--steps", "0"), ("--corpus-documents", "0"), ("--seed", "-1")):
        assert main(["base", "build", option, value, "--cache-dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"populora base: {option} must be ") and "TinyBaseConfig" not in err, err
    assert not any(tmp_path.iterdir())
    # a corpus too small for one sequence: the option, with what it made (it read "seq_len tokens" alone)
    assert (
        main(["base", "build", "--corpus-documents", "1", "--steps", "1", "--cache-dir", str(tmp_path)]) == 2
    )
    err = capsys.readouterr().err
    assert (
        err.startswith("populora base: --corpus-documents is too small: 1 documents make ")
        and "seq_len" in err
    )


def test_train_errors_name_the_options_not_the_config_fields():
    """Same-named options read as config fields ("generations must be", "another run_dir", "population:
    saved 2"), and replace_fraction, which --population sets, as no option at all (a review)."""
    from populora_env.cli import _as_flags

    assert _as_flags("generations must be an int >= 1, got 0") == "--generations must be an int >= 1, got 0"
    assert _as_flags("x is in use by another run (pid 7): wait for it to end or choose another run_dir") == (
        "x is in use by another run (pid 7): wait for it to end or choose another --run-dir"
    )
    differ = "x holds a run with another config (fields [..] differ: replace_fraction: saved 0.5, now 0.25; " \
             "population: saved 2, now 4)"  # fmt: skip
    assert _as_flags(differ).endswith(
        "differ: --population (replace_fraction): saved 0.5, now 0.25; --population: saved 2, now 4)"
    )
    assert _as_flags("a population of 3 generations") == "a population of 3 generations"  # (prose stays)
    assert _as_flags("rounds must be an int >= 1, got 0") == "--rounds must be an int >= 1, got 0"
    assert _as_flags("rank must be <= 8, min(in, out) ...") == "--rank must be <= 8, min(in, out) ..."


def test_a_run_made_at_the_old_default_learning_rate_is_refused_naming_the_option(tmp_path: Path) -> None:
    """The default learning rate went from 1e-2 to 3e-3 (README): a run made before with the default is
    refused on resume with a message that names --learning-rate and the value to give back."""
    from evolve.pbt import _differences
    from populora_env.cli import TrainArgs, _as_flags, _train_config

    old = _train_config(TrainArgs(run_dir=str(tmp_path), learning_rate=1e-2), "base").fingerprint()
    differ = _differences(old, _train_config(TrainArgs(run_dir=str(tmp_path)), "base"))
    assert "--learning-rate (member_options.grpo.learning_rate): saved 0.01, now 0.003" in _as_flags(differ)
    assert (
        _differences(old, _train_config(TrainArgs(run_dir=str(tmp_path), learning_rate=0.01), "base")) == ""
    )


def test_mask_truncated_completions_reaches_the_grpo_config_and_a_resume_names_it(tmp_path: Path) -> None:
    """--mask-truncated-completions sets GRPOConfig's option of that name; the default leaves the run's
    fingerprint as before the option (saved only when on), and a resume with the other value names it."""
    from agents.members import LoRAMemberOptions, grpo_config
    from evolve.pbt import _differences
    from populora_env.cli import TrainArgs, _as_flags, _readable_options, _train_config

    plain = _train_config(TrainArgs(run_dir=str(tmp_path)), "base")
    masked = _train_config(TrainArgs(run_dir=str(tmp_path), mask_truncated_completions=True), "base")
    assert "mask_truncated_completions" not in json.dumps(plain.fingerprint())
    lora = LoRAMemberOptions(base="base")
    assert not grpo_config(plain.member_options, lora).mask_truncated_completions
    assert grpo_config(masked.member_options, lora).mask_truncated_completions
    for saved, now, said in (
        (plain, masked, "--mask-truncated-completions: the run was made without it"),
        (masked, plain, "--mask-truncated-completions: the run was made with it"),
    ):
        assert said in _readable_options(_as_flags(_differences(saved.fingerprint(), now)))


def test_the_resume_hint_of_a_finished_run_says_it_is_finished(tmp_path: Path) -> None:
    """A run stopped by an error after its last checkpoint (a rerun of a finished run in a folder that can no
    longer be written) was told "the same command resumes it" (an audit)."""
    from populora_env.cli import _resume_hint

    assert (
        _resume_hint(tmp_path, 2) == f"no checkpoint in {tmp_path} yet: the same command starts the run again"
    )
    (tmp_path / "checkpoints").mkdir()
    for generation in (1, 2):
        (tmp_path / "checkpoints" / f"gen_{generation:06d}.ckpt").touch()
    last = tmp_path / "checkpoints" / "gen_000002.ckpt"
    assert (
        _resume_hint(tmp_path, 3)
        == f"the same command resumes it from {last} (and ends as an uninterrupted run would)"
    )
    assert _resume_hint(tmp_path, 2) == (
        f"the run is finished ({last}): the same command prints its summary, a larger --generations extends it"
    )


def test_a_resume_with_another_preset_or_determinism_says_so_in_the_options_words(tmp_path: Path) -> None:
    """A changed --preset read as --population/--episodes differences, and --no-deterministic as "saved null,
    now false" (an audit): the message names the preset the run was made with, and the option."""
    from populora_env.cli import _PRESETS, TrainArgs, _readable_options, _saved_presets, _train_config

    for preset in _PRESETS:
        config = _train_config(TrainArgs(preset=preset, run_dir=str(tmp_path / preset)), "base")  # type: ignore[arg-type]
        (tmp_path / f"{preset}.json").write_text(json.dumps(config.fingerprint()))
        assert _saved_presets(tmp_path / f"{preset}.json") == [preset]
    # a --population other than the preset's: the presets of that shape
    config = _train_config(TrainArgs(preset="1t1s", population=3, run_dir=str(tmp_path / "p")), "base")
    (tmp_path / "other.json").write_text(json.dumps(config.fingerprint()))
    assert _saved_presets(tmp_path / "other.json") == ["population", "1t1s"]
    assert _saved_presets(tmp_path / "missing.json") == []
    field = "--deterministic (member_options.grpo.deterministic): "
    assert _readable_options(f"x ({field}saved null, now false)") == (
        "x (--no-deterministic: the run was made without it)"
    )
    assert (
        _readable_options(f"x ({field}saved false, now null)")
        == "x (--no-deterministic: the run was made with it)"
    )
    # a run made before --persist-buffer was the default (a review: "saved false, now true" named no option)
    persist = "--persist-buffer (env.persist_buffer): saved false, now true"
    assert _readable_options(f"x ({persist})") == "x (--no-persist-buffer: the run was made with it)"


def test_a_one_member_preset_refuses_a_larger_population(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--preset 1t1s --population 2`` built the population preset's run and called it 1t1s (an audit);
    refused before anything is built or made."""
    for preset in ("1t1s", "self-play"):
        argv = ["train", "--preset", preset, "--population", "2", "--run-dir", str(tmp_path / "run")]
        assert main(argv) == 2
        assert f"--preset {preset} has one member per role, got --population 2" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    from populora_env.cli import _as_flags

    assert _as_flags("fields ['self_play'] differ: self_play: saved false, now true") == (
        "fields ['self_play'] differ: --preset (self_play): saved false, now true"
    )
    assert (
        _as_flags("env.persist_buffer: saved true, now false")
        == "--persist-buffer (env.persist_buffer): saved true, now false"
    )


def test_the_examples_refuse_bad_settings_in_one_line(tmp_path: Path) -> None:
    """Examples 01 and 02 raised tracebacks on settings the library refuses (--difficulty 5, --seed -1,
    --threads 0, a --cache-dir that is a file), and 02 trained nothing, without a word, at --group-size 1
    (an audit)."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "a-file").write_text("")
    for script, args, message in (
        ("01_play.py", ["--difficulty", "5"], "01_play: --difficulty must be in [0, 1], got 5.0"),
        ("01_play.py", ["--seed", "-1"], "01_play: --seed must be >= 0, got -1"),
        ("02_lora_selfplay.py", ["--threads", "0"], "02_lora_selfplay: --threads must be >= 1, got 0"),
        ("02_lora_selfplay.py", ["--group-size", "1"], "02_lora_selfplay: --group-size must be >= 2"),
        ("02_lora_selfplay.py", ["--cache-dir", str(tmp_path / "a-file")], "cannot be made: it is a file"),
        ("02_lora_selfplay.py", ["--base-steps", "0", "--cache-dir", str(tmp_path / "c")],
         "02_lora_selfplay: --base-steps must be >= 1, got 0"),
    ):  # fmt: skip
        done = subprocess.run([sys.executable, str(root / "examples" / script), *args], capture_output=True,
                              text=True, timeout=300, cwd=root)  # fmt: skip
        assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_record_id_is_a_string_or_an_integer(tmp_path: Path) -> None:
    """Any JSON value was an id (a list showed as "['a']"), where every other field is typed (an audit)."""
    data = tmp_path / "ids.jsonl"
    line = '{{"code": "def f(x):\\n    return x", "input": "1", "id": {}}}\n'
    data.write_text("".join(line.format(i) for i in ('["a"]', "5", '"five"', "1.5", "null")))
    records, errors = load_records(data)
    assert [r.id for r in records] == ["5", "five", "line 5"]
    assert [(e.line, e.reason) for e in errors] == [(1, "field 'id' is not a string or an integer"),
                                                    (4, "field 'id' is not a string or an integer")]  # fmt: skip
    (tmp_path / "one.jsonl").write_text(line.format(7))
    assert (
        "one.jsonl: 1 record in " in populora("verify", str(tmp_path / "one.jsonl")).stdout
    )  # ("1 records")
