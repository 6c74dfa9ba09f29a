"""Mixed-adapter rollouts: our stacked-gather batch vs PEFT's ``adapter_names=`` batch vs a ``set_adapter``
loop vs the bare base without adapters, on the same prompts and the same number of generated tokens.

Usage:
    python bench/rollouts.py [--adapters 8] [--prompts-per-adapter 4] [--new-tokens 128] [--repeats 3]
                             [--target-modules default|all-linear] [--base DIR] [--threads N]

Prints one JSON line with, for each path, the median wall time of one full generation and its generated
tokens per second, the ratios (``stacked_speedup_vs_loop``: target >= 3; ``stacked_time_vs_bare``: target
<= 1.3), whether the stacked path's greedy texts equal the loop's, and memory: RSS growth of loading the bare
base vs loading the 8-adapter population (one base plus adapters), each in a fresh subprocess after the
imports, and exact parameter bytes. All four paths
run through the same KV-cached decoding loop (``agents.generation.decode``) with greedy decoding and EOS
ignored, in interleaved rounds, so only the forward pass differs; the prompts are distinct, so the loop's
shared prefill of repeated (prompt, adapter) rows never applies here. The default base is the tiny offline base
(built on first use, ~1 minute). Progress goes to stderr.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import tyro

from agents.base import build_tiny_base, load_base
from agents.corpus import generate_examples
from agents.generation import decode
from agents.population import LoRAPopulation


@dataclass(frozen=True)
class Args:
    """Benchmark settings."""

    adapters: int = 8
    """Population size; rows are assigned to adapters round-robin."""
    prompts_per_adapter: int = 4
    """Prompts per adapter (batch = adapters * prompts_per_adapter)."""
    new_tokens: int = 128
    """Generated tokens per prompt (EOS ignored, so every path generates exactly this many)."""
    repeats: int = 3
    """Interleaved timing rounds; the median is reported."""
    rank: int = 8
    """LoRA rank."""
    target_modules: Literal["default", "all-linear"] = "default"
    """PEFT's default targets for the architecture (q_proj, v_proj for Llama) or every linear layer."""
    base: str | None = None
    """Base model directory or Hub id; None builds/reuses the tiny offline base."""
    threads: int | None = None
    """torch intra-op threads; None keeps torch's default."""
    seed: int = 0
    """Seed of the adapters' random lora_B and of the prompts."""
    probe: Literal["none", "bare", "population"] = "none"
    """Internal: measure the RSS growth of one load in this process and exit."""


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


def memory_probe(kind: str, base_ref: str, args: Args) -> float:
    """RSS growth (MiB) of loading the bare base or the population, in a fresh Python process each."""
    command = [
        sys.executable,
        __file__,
        "--probe",
        kind,
        "--base",
        base_ref,
        "--adapters",
        str(args.adapters),
    ]
    command += ["--rank", str(args.rank), "--target-modules", args.target_modules]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rss_growth_mb"])


def timed(fn: Callable[[], list[str]]) -> tuple[float, list[str]]:
    start = time.perf_counter()
    texts = fn()
    return time.perf_counter() - start, texts


def main(args: Args) -> None:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    base_ref = args.base or str(build_tiny_base(num_threads=args.threads))
    names = [f"member_{i}" for i in range(args.adapters)]
    targets = None if args.target_modules == "default" else "all-linear"
    if args.probe != "none":  # memory probe, run in a fresh subprocess by the main benchmark
        rss_start = rss_bytes()
        if args.probe == "bare":
            kept: object = load_base(base_ref)
        else:
            kept = LoRAPopulation.from_pretrained(base_ref, names, rank=args.rank, target_modules=targets)
        print(json.dumps({"rss_growth_mb": round((rss_bytes() - rss_start) / 2**20, 1), "kept": id(kept)}))
        return
    rss = {kind: memory_probe(kind, base_ref, args) for kind in ("bare", "population")}
    bare, tokenizer = load_base(base_ref)
    pop = LoRAPopulation.from_pretrained(
        base_ref, names, rank=args.rank, target_modules=targets, seed=args.seed
    )
    generator = torch.Generator().manual_seed(args.seed)
    for name in names:  # non-zero lora_B: every adapter really differs from the base and the others
        genome = pop.get_genome(name)
        pop.set_genome(
            name,
            {
                k: torch.randn(v.shape, generator=generator) * 0.2 if ".lora_B." in k else v
                for k, v in genome.items()
            },
        )

    n_rows = args.adapters * args.prompts_per_adapter
    prompts = [e.prompt for e in generate_examples(n_rows, seed=args.seed)]
    rows = [names[i % args.adapters] for i in range(n_rows)]
    common: dict[str, Any] = dict(max_new_tokens=args.new_tokens, temperature=0.0, seed=0, ignore_eos=True)
    paths: dict[str, Callable[[], list[str]]] = {
        "stacked": lambda: pop.generate(prompts, rows, strategy="stacked", **common),
        "peft_mixed": lambda: pop.generate(prompts, rows, strategy="peft_mixed", **common),
        "loop": lambda: pop.generate(prompts, rows, strategy="loop", **common),
        "bare": lambda: decode(bare, tokenizer, prompts, **common),
    }
    print(f"base {base_ref}, batch {n_rows}, {args.new_tokens} tokens, warm-up", file=sys.stderr)
    texts = {name: fn() for name, fn in paths.items()}  # warm-up and the equality check
    times: dict[str, list[float]] = {name: [] for name in paths}
    for round_ in range(args.repeats):
        for name, fn in paths.items():
            seconds, _ = timed(fn)
            times[name].append(seconds)
            print(f"round {round_ + 1}/{args.repeats} {name}: {seconds:.3f} s", file=sys.stderr)

    tokens = n_rows * args.new_tokens
    median = {name: statistics.median(values) for name, values in times.items()}
    base_params = sum(p.numel() * p.element_size() for p in bare.parameters())
    adapter_params = sum(
        p.numel() * p.element_size() for n, p in pop.model.named_parameters() if ".lora_" in n
    )
    record = {
        "bench": "rollouts",
        "base": os.path.basename(base_ref.rstrip("/")),
        "base_params": sum(p.numel() for p in bare.parameters()),
        "dtype": str(next(bare.parameters()).dtype).removeprefix("torch."),
        "device": str(pop.device),
        "threads": torch.get_num_threads(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "adapters": args.adapters,
        "rank": args.rank,
        "target_modules": sorted(pop.model.peft_config[names[0]].target_modules),
        "batch": n_rows,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        **{f"{name}_s": round(value, 4) for name, value in median.items()},
        **{f"{name}_tokens_per_s": round(tokens / value, 1) for name, value in median.items()},
        "stacked_speedup_vs_loop": round(median["loop"] / median["stacked"], 3),
        "stacked_speedup_vs_peft_mixed": round(median["peft_mixed"] / median["stacked"], 3),
        "stacked_time_vs_bare": round(median["stacked"] / median["bare"], 3),
        "peft_mixed_speedup_vs_loop": round(median["loop"] / median["peft_mixed"], 3),
        "peft_mixed_time_vs_bare": round(median["peft_mixed"] / median["bare"], 3),
        "target_speedup_vs_loop": 3.0,
        "target_time_vs_bare": 1.3,
        "stacked_greedy_equals_loop": texts["stacked"] == texts["loop"],
        "stacked_greedy_equals_peft_mixed": texts["stacked"] == texts["peft_mixed"],
        "rss_growth_bare_base_mb": rss["bare"],
        "rss_growth_population_mb": rss["population"],
        "base_param_mb": round(base_params / 2**20, 2),
        "adapters_param_mb": round(adapter_params / 2**20, 3),
        "separate_models_param_mb": round(args.adapters * base_params / 2**20, 2),
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main(tyro.cli(Args))
