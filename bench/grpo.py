"""Benchmark: the GRPO generate -> score -> update cycle, ours (`GRPOLearner.step`) vs TRL's `GRPOTrainer`.

Run (CPU, about 3-4 minutes; one JSON line on stdout, progress on stderr)::

    .venv/bin/python bench/grpo.py
    .venv/bin/python bench/grpo.py --steps 10 --prompts 4 --group-size 8 --max-new-tokens 48

Needs ``trl`` for the peer (``.venv/bin/pip install trl``; benchmark only, not a package dependency); a missing
peer is recorded as such in the JSON, never silently dropped.

Both sides get the same tiny Llama base (built offline into a temporary directory with
``agents.base.build_tiny_base``; only a few pretraining steps, since throughput does not depend on quality),
the same prompts (the game's student prompts, 70-110 tokens), the same reward (1 if the completion is a
well-formed answer by the env's own parser, else 0), group size, prompts per step, completion budget,
sampling (temperature 1, no top-k/top-p), PEFT LoRA config, fp32, loss ``dapo``, beta 0, one inner epoch, no
gradient accumulation, the same torch thread count. TRL runs with ``report_to="none"``, no vLLM, no hub;
it is measured twice: with gradient checkpointing off (its faster setting at this size; the headline
ratio) and with its default (on).

Where the difference comes from: both our generation and our update run each distinct prompt once and
share its KV cache with the group's completions (TRL runs every row's full prompt, in generation and in the
loss); the population decodes with its own KV-cached loop, whose cache appends in place where transformers'
``DynamicCache`` (TRL's, through ``generate``) copies the whole cache at every token; and the update trains on
the generated token ids as they are (TRL does too; no re-tokenisation). Throughput is completions per second from the median step time after the
first (warm-up) step, timed around whole steps (generate, score, update). Completion lengths differ run to
run (sampling stops at EOS), so tokens per second are reported too.

Memory: resident set size (RSS) of fresh processes holding (a) nothing but the imports, (b) the base
alone and (c) a population of 8 adapters on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import tyro

TARGETS = ["q_proj", "v_proj"]


@dataclass(frozen=True)
class Args:
    """Benchmark settings (defaults sized for 2 CPU cores)."""

    steps: int = 6
    """Generate-score-update cycles per side (the first is warm-up and not timed)."""
    prompts: int = 4
    """Distinct prompts per step (each one GRPO group)."""
    group_size: int = 8
    """Completions per prompt."""
    max_new_tokens: int = 48
    """Completion budget."""
    rank: int = 8
    """LoRA rank (q_proj and v_proj, alpha = rank)."""
    hidden_size: int = 256
    """Tiny base width (the default tiny base's)."""
    num_layers: int = 4
    """Tiny base depth."""
    pretrain_steps: int = 5
    """Pretraining steps of the bench base (throughput needs a valid model, not a good one)."""
    seed: int = 0
    """Seed of the base, the adapters and sampling."""
    threads: int = 1
    """torch intra-op threads for both sides (1 is stable on a shared 2-core machine)."""
    base_cache: str = ""
    """Build/reuse the bench base under this directory instead of a fresh temporary one."""
    memory_probe: str = ""
    """Internal: "", "bare", "base" or "pop8" (measure RSS in this process and print it)."""
    base_dir: str = ""
    """Internal: the base directory for a memory probe."""


def game_prompts(n: int, seed: int) -> dict[str, str]:
    """The first `n` student prompts (solve deduction/abduction/induction) of the game corpus: prompt -> task type."""
    from agents.corpus import generate_examples

    out: dict[str, str] = {}
    for example in generate_examples(8 * n, seed=seed):
        if example.kind.startswith("solve_") and len(out) < n:
            out[example.prompt] = example.kind.removeprefix("solve_")
    return out


class FormatReward:
    """1.0 when the completion is a well-formed answer for the prompt's task type (the env's own parser)."""

    def __init__(self, task_types: dict[str, str]) -> None:
        self.task_types = task_types

    def __call__(self, prompt: str, completion: str) -> float:
        from populora_env.text_format import Answer, parse_answer

        parsed = parse_answer(completion, self.task_types[prompt], max_chars=4000)  # type: ignore[arg-type]
        return 1.0 if isinstance(parsed, Answer) else 0.0


def log(message: str) -> None:
    print(f"[bench/grpo] {message}", file=sys.stderr, flush=True)


def rss_mb() -> float:
    """Resident set size of this process in MiB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


def build_base(args: Args, root: Path) -> Path:
    from agents.base import TinyBaseConfig, build_tiny_base

    config = TinyBaseConfig(
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        intermediate_size=int(args.hidden_size * 2.6875),
        corpus_documents=400,
        steps=args.pretrain_steps,
        warmup_steps=1,
        seed=args.seed,
        bf16_autocast=False,
    )
    return build_tiny_base(root, config, progress=False)


def run_ours(args: Args, base_dir: Path, reward: FormatReward) -> dict[str, float]:
    from agents.grpo import GRPOConfig, GRPOLearner
    from agents.population import LoRAPopulation

    pop = LoRAPopulation.from_pretrained(
        base_dir,
        names=["p0"],
        rank=args.rank,
        target_modules=TARGETS,
        dtype=torch.float32,
        device="cpu",
        seed=args.seed,
    )
    cfg = GRPOConfig(
        learning_rate=1e-5,
        loss_type="dapo",
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        seed=args.seed,
    )
    learner = GRPOLearner(pop, cfg)
    prompts = list(reward.task_types)
    durations, cpu, lengths, rewards = [], [], [], []
    for step in range(args.steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = learner.step("p0", prompts, reward)
        durations.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        lengths.append(result.stats.num_tokens / result.stats.num_samples)  # trained tokens, EOS included
        rewards.append(sum(result.rewards) / len(result.rewards))
        log(f"ours step {step}: {durations[-1]:.2f} s wall, {cpu[-1]:.2f} s cpu, reward {rewards[-1]:.2f}")
    return summarise(args, durations, cpu, lengths, rewards)


def summarise(
    args: Args, durations: list[float], cpu: list[float], lengths: list[float], rewards: list[float]
) -> dict[str, float]:
    """Throughput from the median step time after the warm-up step, by wall clock and by process CPU time.

    With one torch thread, CPU time counts the work done and is far less sensitive than wall time to other
    processes on a shared machine.
    """
    step_s, step_cpu_s = statistics.median(durations[1:]), statistics.median(cpu[1:])
    tokens = statistics.mean(lengths[1:])
    samples = args.prompts * args.group_size
    return {
        "median_step_s": step_s,
        "median_step_cpu_s": step_cpu_s,
        "samples_per_s": samples / step_s,
        "samples_per_cpu_s": samples / step_cpu_s,
        "mean_completion_tokens": tokens,
        "completion_tokens_per_s": samples * tokens / step_s,
        "mean_reward": statistics.mean(rewards),
    }


def run_trl(
    args: Args, base_dir: Path, out_dir: Path, reward: FormatReward, checkpointing: bool
) -> dict[str, Any]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    ends: list[tuple[float, float]] = []
    lengths: list[float] = []
    rewards: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ends.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            durations.append(time.perf_counter() - ends[-1][0])
            cpu.append(time.process_time() - ends[-1][1])
            log(f"trl step {state.global_step - 1}: {durations[-1]:.2f} s wall, {cpu[-1]:.2f} s cpu")

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs = kwargs.get("logs")
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))
                rewards.append(float(logs.get("reward", float("nan"))))

    durations: list[float] = []
    cpu: list[float] = []

    def reward_fn(prompts: list[str], completions: list[str], **kwargs: object) -> list[float | None]:
        return [reward(p, c) for p, c in zip(prompts, completions, strict=True)]

    config = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=args.prompts * args.group_size,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        max_steps=args.steps,
        learning_rate=1e-5,
        loss_type="dapo",
        beta=0.0,
        num_iterations=1,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        use_vllm=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=args.seed,
        model_init_kwargs={"dtype": torch.float32},
        dataloader_num_workers=0,
        disable_tqdm=True,
        gradient_checkpointing=checkpointing,
    )
    lora = LoraConfig(r=args.rank, lora_alpha=args.rank, target_modules=TARGETS, lora_dropout=0.0)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    dataset = Dataset.from_dict({"prompt": list(reward.task_types) * args.steps})
    trainer = GRPOTrainer(
        model=str(base_dir),
        reward_funcs=reward_fn,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=[Timer()],
    )
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout is for the JSON line
        trainer.train()
    return {**summarise(args, durations, cpu, lengths, rewards), "version": metadata.version("trl")}


def memory_probe(kind: str, base_dir: str, rank: int) -> None:
    """Print this process's RSS (MiB) after loading what `kind` names; run in a fresh interpreter."""
    import peft  # noqa: F401
    import transformers  # noqa: F401

    from agents.base import load_base
    from agents.population import LoRAPopulation

    holder: object = None
    if kind == "base":
        holder = load_base(base_dir, dtype=torch.float32, device="cpu")
    elif kind == "pop8":
        names = [f"p{i}" for i in range(8)]
        holder = LoRAPopulation.from_pretrained(
            base_dir, names=names, rank=rank, target_modules=TARGETS, dtype=torch.float32, device="cpu"
        )
    assert kind in {"bare", "base", "pop8"}
    print(json.dumps({"rss_mb": rss_mb(), "held": type(holder).__name__}))


def measure_memory(base_dir: Path, rank: int) -> dict[str, float]:
    out = {}
    for kind in ("bare", "base", "pop8"):
        cmd = [
            sys.executable,
            __file__,
            "--memory-probe",
            kind,
            "--base-dir",
            str(base_dir),
            "--rank",
            str(rank),
        ]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, check=True, env=os.environ | {"PYTHONPATH": _root()}
        )
        out[kind] = json.loads(proc.stdout.strip().splitlines()[-1])["rss_mb"]
    return out


def _root() -> str:
    root = str(Path(__file__).resolve().parent.parent)
    extra = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{extra}" if extra else root


def main(args: Args) -> None:
    if args.memory_probe:
        memory_probe(args.memory_probe, args.base_dir, args.rank)
        return
    if args.steps < 2:
        raise ValueError("--steps must be >= 2 (the first step is warm-up)")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        t0 = time.perf_counter()
        base_dir = build_base(args, Path(args.base_cache or tmp))
        log(f"built base in {time.perf_counter() - t0:.1f} s: {base_dir}")
        from transformers import AutoConfig

        n_params = _count_params(base_dir)
        reward = FormatReward(game_prompts(args.prompts, args.seed))
        ours = run_ours(args, base_dir, reward)
        try:
            # TRL's GRPOConfig turns gradient checkpointing on by default; off is its faster setting here.
            peer: dict[str, Any] = run_trl(args, base_dir, Path(tmp) / "trl-out", reward, checkpointing=False)
            peer_default = run_trl(args, base_dir, Path(tmp) / "trl-out-gc", reward, checkpointing=True)
        except ImportError as exc:
            peer = peer_default = {"missing": f"trl not importable: {exc}"}
        memory = measure_memory(base_dir, args.rank)
        hidden = AutoConfig.from_pretrained(base_dir).hidden_size
    pop_net, base_net = memory["pop8"] - memory["bare"], memory["base"] - memory["bare"]
    print(
        json.dumps(
            {
                "bench": "grpo",
                "model": {
                    "params": n_params,
                    "hidden_size": hidden,
                    "layers": args.num_layers,
                    "dtype": "float32",
                },
                "workload": {
                    "prompts_per_step": args.prompts,
                    "group_size": args.group_size,
                    "max_new_tokens": args.max_new_tokens,
                    "timed_steps": args.steps - 1,
                    "lora_rank": args.rank,
                    "loss_type": "dapo",
                },
                "ours": ours,
                "trl": peer,
                "trl_with_default_gradient_checkpointing": peer_default,
                "ratios_ours_over_trl": ratios(ours, peer),
                "ratios_ours_over_trl_default_checkpointing": ratios(ours, peer_default),
                "target_ratio": 1.5,
                "memory_rss_mb": {
                    "bare_imports": memory["bare"],
                    "base_alone": memory["base"],
                    "population_8_adapters": memory["pop8"],
                    "population_over_base_net_of_imports": pop_net / base_net if base_net > 0 else None,
                },
                "torch_threads": torch.get_num_threads(),
                "load_average_1min": os.getloadavg()[0],
            }
        )
    )


def ratios(ours: dict[str, float], peer: dict[str, Any]) -> dict[str, float] | None:
    """Ours over the peer for each throughput figure (None when the peer is missing)."""
    keys = ("samples_per_s", "samples_per_cpu_s", "completion_tokens_per_s")
    return {key: ours[key] / peer[key] for key in keys} if "samples_per_s" in peer else None


def _count_params(base_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in base_dir.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                total += _prod(f.get_slice(key).get_shape())
    return total


def _prod(shape: list[int]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


if __name__ == "__main__":
    main(tyro.cli(Args))
