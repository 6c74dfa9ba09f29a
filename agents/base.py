"""Base models: load any causal LM frozen, or build the tiny offline Llama base used by tests and examples.

Honest scope: the tiny base (3.4M parameters, a few CPU-minutes of pretraining) learns the *syntax* of the
game's answers (Python functions and AZR's fenced answer blocks), not program semantics. It exists to
exercise the mechanics (adapters, batched rollouts, GRPO, evolution) offline; research runs use a real
base (e.g. Qwen2.5-Coder) on a GPU.

Measured on the shared 2-core development box (greedy answers to 36 held-out env prompts): 120 steps
(~3 CPU-minutes) gave the env's answer format 12/36 times and valid Python in 2/24 program answers; the
default 360 steps (~9 CPU-minutes on one thread) gave 34/36 and 22/24.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import math
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agents.corpus import generate_examples
from populora_env.progress import watched

BUILD_FORMAT_VERSION = 2  # bump when the builder's code changes what it produces
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")

logger = logging.getLogger(__name__)


class BaseModelLoadError(OSError):
    """A base model that cannot be found or loaded (the message names the path or id)."""


def hub_offline() -> bool:
    """Whether Hugging Face Hub access is switched off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(flag.strip().lower() in {"1", "true", "yes", "on"} for flag in flags)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively (fast), rather than by emulation.

    On CPUs without AVX512-BF16/AMX, bf16 matmuls are emulated: measured ~9x slower than fp32 on the AVX2
    EPYC of the development machine, so such CPUs get fp32.
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":  # torch exposes the CPU feature checks only as private helpers
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)
    return False


# cuBLAS is deterministic only with a workspace setting such as this one (":16:8" is the other), read when
# cuBLAS starts (PyTorch's "Reproducibility" notes); torch.use_deterministic_algorithms(True) refuses cuBLAS
# calls without one.
_CUBLAS_WORKSPACE = ":4096:8"


@contextlib.contextmanager
def deterministic_kernels(device: torch.device, enabled: bool = True) -> Iterator[None]:
    """PyTorch's deterministic kernels for the block when ``device`` is CUDA (the previous setting is
    restored after); a no-op on CPU or when ``enabled`` is False.

    CUDA's default memory-efficient attention backward accumulates with atomics, so two identical updates
    can differ in the last bits; with this on, PyTorch picks its deterministic variants and raises
    ``RuntimeError`` for an operation that has none (rather than silently breaking exact resume). cuBLAS's
    workspace setting is ``load_base``'s job: set here, after cuBLAS has started, it would only silence
    PyTorch's check of it.
    """
    if not enabled or device.type != "cuda":
        yield
        return
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


@contextlib.contextmanager
def no_cudnn_attention(device: torch.device) -> Iterator[None]:
    """Keep PyTorch's scaled-dot-product attention off the cuDNN backend for the block on CUDA (the
    previous setting is restored after); a no-op on CPU or where the cuDNN backend is already off.

    Why: on Hopper and Blackwell datacenter GPUs with a recent cuDNN, PyTorch puts cuDNN attention first
    (``check_prefer_cudnn_attention`` in ATen's ``transformers/cuda/sdp_utils.cpp``), and cuDNN builds an
    execution graph for every new problem shape (cached by batch size, key length, ...; tens of
    milliseconds of host time per build). Decoding with a KV cache grows the key length by one at every
    token and RL batches change length from one update to the next, so nearly every call would pay a
    build. FlashAttention and the memory-efficient kernel have no per-shape build and take the call
    instead. Backends the caller turned off stay off: this only ever turns cuDNN off. A PyTorch without
    the switch (older than the cuDNN backend) has nothing to turn off.
    """
    backends = torch.backends.cuda
    if device.type != "cuda" or not getattr(backends, "cudnn_sdp_enabled", lambda: False)():
        yield
        return
    backends.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        backends.enable_cudnn_sdp(True)


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_base(
    name_or_path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer, frozen and in eval mode.

    Args:
        name_or_path: a local model directory or a Hub id (fetched only when the Hub is not offline).
        dtype: parameter dtype; ``None`` picks bf16 where the device computes it natively, else fp32.
        device: target device; ``None`` picks CUDA when available.

    Returns:
        ``(model, tokenizer)``; the tokenizer has a pad token and pads on the left (for generation).

    Raises:
        BaseModelLoadError: the model or tokenizer cannot be found or loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = os.fspath(name_or_path)
    target = torch.device(device) if device is not None else default_device()
    if dtype is None:
        dtype = torch.bfloat16 if native_bf16(target) else torch.float32
    if missing_local_dir(ref):
        raise BaseModelLoadError(_load_message(ref, "no such local directory"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(ref)
        model = AutoModelForCausalLM.from_pretrained(ref, dtype=dtype)
    except Exception as exc:  # transformers raises OSError, ValueError, HFValidationError, ...
        raise BaseModelLoadError(_load_message(ref, f"{type(exc).__name__}: {exc}")) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.requires_grad_(False)
    model.eval()
    if target.type == "cuda":  # before cuBLAS starts (deterministic_kernels relies on it)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_WORKSPACE)
    model.to(target)  # type: ignore[arg-type]  # transformers' stub types .to() narrowly
    return model, tokenizer


def missing_local_dir(ref: str) -> bool:
    """Whether a base reference names a local path (a Hub id is ``name`` or ``org/name``) where there is no
    directory: it cannot load."""
    names_a_path = ref.startswith(("/", ".", "~")) or ref.count("/") > 1 or Path(ref).exists()
    return names_a_path and not Path(ref).expanduser().is_dir()


def _load_message(ref: str, reason: str) -> str:
    reason = reason.rstrip().rstrip(".")  # (a sentence follows: transformers' own ends with a period)
    if (Path(ref) / "populora_tiny_base.json").is_file():  # a tiny base of the cache that no longer loads
        damage = _damage(Path(ref))
        if damage is not None:
            return (
                f"cannot load base model {ref!r}: {reason}. It is a tiny base of the cache, damaged after "
                f"its build ({damage}): delete that folder, and `populora base build` (or `populora train`) "
                "builds it again."
            )
        import transformers
        from packaging.version import Version

        version = transformers.__version__
        floor = " (this package needs >= 4.56)" if Version(version) < Version("4.56") else ""
        return (  # its files are whole: the loader's own failure (e.g. a transformers it was not built by)
            f"cannot load base model {ref!r}: {reason}. It is a tiny base of the cache whose files are whole; "
            f"this is transformers {version}{floor} failing to load it."
        )
    local = Path(ref).expanduser()
    if local.is_dir() and not (local / "config.json").is_file():  # (the advice was about the Hub: an audit)
        return (
            f"cannot load base model {ref!r}: the folder holds no config.json, so it is no Hugging Face model "
            "folder; pass one written by save_pretrained, or the directory `populora base build` prints"
        )
    hub = (
        "Hub access is off (HF_HUB_OFFLINE=1), so only local directories load"
        if hub_offline()
        else "Hub access is on; set HF_HUB_OFFLINE=1 to stay offline"
    )
    return (
        f"cannot load base model {ref!r}: {reason}. {hub}. "
        "For an offline base, build one with `populora base build` (or agents.build_tiny_base()) and pass the "
        "directory it prints (returns)."
    )


# ---------------------------------------------------------------------------------------------------------
# The tiny offline base
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TinyBaseConfig:
    """How the tiny Llama base is built; the cache key is a hash of these fields."""

    vocab_size: int = 1024
    """BPE vocabulary size, special tokens included."""
    hidden_size: int = 256
    """Model width."""
    num_layers: int = 4
    """Number of decoder layers."""
    num_heads: int = 4
    """Attention heads (also key/value heads: plain multi-head attention)."""
    intermediate_size: int = 688
    """Width of the SwiGLU MLP."""
    max_position_embeddings: int = 2048
    """Longest sequence (prompt plus generation) the model supports."""
    corpus_documents: int = 6000
    """Number of generated game-format documents for the tokenizer and pretraining."""
    seq_len: int = 384
    """Tokens per pretraining sequence (documents are packed)."""
    batch_size: int = 8
    """Sequences per optimizer step."""
    steps: int = 360
    """Optimizer steps."""
    learning_rate: float = 3e-3
    """Peak AdamW learning rate (linear warmup, cosine decay)."""
    warmup_steps: int = 20
    """Linear warmup steps."""
    seed: int = 0
    """Seed of the corpus, the initial weights and the batch order."""
    bf16_autocast: bool | None = None
    """bf16 autocast for pretraining; ``None`` uses it only where the CPU has native bf16."""

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "steps")
        for name in (*positive, "max_position_embeddings", "corpus_documents", "seq_len", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TinyBaseConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size < 300:
            raise ValueError(
                f"TinyBaseConfig.vocab_size must be >= 300 (byte alphabet), got {self.vocab_size}"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"TinyBaseConfig.num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})"
            )
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError("TinyBaseConfig.hidden_size // num_heads must be even (rotary embeddings)")
        if self.seq_len > self.max_position_embeddings:
            raise ValueError("TinyBaseConfig.seq_len must be <= max_position_embeddings")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"TinyBaseConfig.learning_rate must be finite and > 0, got {self.learning_rate}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError("TinyBaseConfig.warmup_steps must be in [0, steps]")
        if not (isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0):
            # as PBTConfig.seed (`populora train --seed -1` was refused, `populora base build --seed -1` built)
            raise ValueError(f"TinyBaseConfig.seed must be an int >= 0, got {self.seed!r}")


def default_cache_dir() -> Path:
    """``$POPULORA_CACHE_DIR``, else ``~/.cache/populora``."""
    env = os.environ.get("POPULORA_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "populora"


def _resolved(config: TinyBaseConfig) -> TinyBaseConfig:
    if config.bf16_autocast is None:
        return dataclasses.replace(config, bf16_autocast=native_bf16(torch.device("cpu")))
    return config


def tiny_base_key(config: TinyBaseConfig) -> str:
    """The cache key of a config: a hash of its (resolved) fields and the builder's format version."""
    payload = json.dumps({"v": BUILD_FORMAT_VERSION, **dataclasses.asdict(_resolved(config))}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def build_tiny_base(
    cache_dir: str | os.PathLike[str] | None = None,
    config: TinyBaseConfig | None = None,
    *,
    progress: bool = True,
    num_threads: int | None = None,
) -> Path:
    """Build (or reuse) the tiny offline base and return its Hugging Face model directory.

    The build trains a byte-level BPE tokenizer with ``tokenizers`` on a generated corpus of game-format
    documents, creates a ``LlamaConfig`` model and pretrains it on the same corpus. It is written to a
    temporary directory and renamed into place, so an interrupted build never leaves a partial cache.

    Args:
        cache_dir: cache root; ``None`` uses :func:`default_cache_dir`.
        config: what to build; ``None`` uses the defaults (3.4M parameters, ~9 CPU-minutes on one thread).
        progress: show a tqdm progress bar on stderr (where it is a terminal or a notebook).
        num_threads: torch intra-op threads during the build (restored afterwards); ``None`` keeps the
            current setting. A model this small gains little from threads, and on a loaded machine OpenMP
            contention made 2 threads ~15x slower than 1 (measured here).

    Returns:
        ``<cache_dir>/tiny-base-<key>``, loadable with :func:`load_base` or ``from_pretrained``.
    """
    if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
        raise ValueError(f"num_threads must be None or an int >= 1, got {num_threads!r}")
    if cache_dir is not None and not os.fspath(cache_dir).strip():  # ("" was the working folder)
        raise ValueError(f"cache_dir must be None or a non-empty path, got {cache_dir!r}")
    config = _resolved(config or TinyBaseConfig())
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    key = tiny_base_key(config)
    final = root / f"tiny-base-{key}"
    # lexists: a link to nothing does not `exist`, and a whole build then failed to rename onto it
    if os.path.lexists(final):
        damage = _damage(final)
        if damage is None:
            return final
        # a cached base damaged after its build (builds are renamed into place whole): built again
        logger.warning("the cached tiny base %s is damaged (%s): building it again", final, damage)
        aside = root / f".tmp-{key}-{os.getpid()}-damaged"
        _remove(aside)
        try:
            os.rename(final, aside)
        except FileNotFoundError:
            pass  # another process sharing the cache moved it first (and builds it too; the rename decides)
        _remove(aside)
    _make_cache_folder(root)
    with _building(root):
        if os.path.lexists(final) and _damage(final) is None:  # built by the process this one waited for
            return final
        _remove_stale_builds(root, key)
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-{os.getpid()}-", dir=root))
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(num_threads if num_threads is not None else threads)
            _build_into(staging, config, progress)
            record = {**dataclasses.asdict(config), "model_sha256": _sha256(staging / "model.safetensors")}
            (staging / "populora_tiny_base.json").write_text(json.dumps(record, indent=2))
            try:
                os.rename(staging, final)
            except OSError:
                if not (final / "config.json").is_file():  # a concurrent builder won the rename otherwise
                    raise
        finally:
            torch.set_num_threads(threads)
            shutil.rmtree(staging, ignore_errors=True)
    return final


@contextlib.contextmanager
def _building(root: Path) -> Iterator[None]:
    """One build at a time in a cache: an exclusive ``flock`` on the cache folder itself (no lock file left
    behind; the kernel releases it when a builder dies). Two first runs on a fresh machine each pretrained the
    same base for minutes (a review); the second now waits, says so, and takes the first one's. A file
    system without ``flock`` builds unlocked, as before."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning("another process is building a tiny base in %s: waiting for it to finish", root)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # (no flock here)
            pass
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _make_cache_folder(root: Path) -> None:
    """``root`` made if missing; ``OSError`` naming it and what stands in the way (was ``[Errno 17] File
    exists: '...'`` for a file or a link to nothing there, with no word of the cache)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        if root.is_symlink() and not root.exists():
            why = f"it is a link to nothing ({os.readlink(root)})"
        elif root.exists() and not root.is_dir():
            why = "it is a file"
        else:
            why = error.strerror or str(error)  # no permission; a part of its path that is a file
        raise OSError(f"the tiny-base cache folder {root} cannot be made: {why}") from error


_BASE_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "populora_tiny_base.json",
)


def _damage(folder: Path) -> str | None:
    """What is wrong with a cached tiny base (None: nothing found): not a folder (a file, a dangling link), a
    missing file, weights whose header does not cover the file (safetensors checks that on opening), a
    tokenizer that does not parse, a JSON file that is not an object (``config.json`` a model's config)."""
    from safetensors import safe_open
    from tokenizers import Tokenizer

    if folder.is_symlink() and not folder.exists():
        return "a link to nothing"
    if not folder.is_dir():
        return "not a folder"
    for name in _BASE_FILES:
        if not (folder / name).is_file():
            return f"no {name}"
    try:
        with safe_open(folder / "model.safetensors", "pt"):
            pass
        Tokenizer.from_file(str(folder / "tokenizer.json"))
        for name in ("config.json", "tokenizer_config.json", "populora_tiny_base.json"):
            # (a damaged tokenizer_config.json, or a config.json of `{}`, was taken for whole, and the load's
            # error blamed transformers: a robustness review)
            data = json.loads((folder / name).read_text())
            if not isinstance(data, dict) or (name == "config.json" and "model_type" not in data):
                return f"{name} is not a {'model config' if name == 'config.json' else 'JSON object'}"
        # weights changed after the build (bytes whose header still parses: NaN weights trained on, and a
        # member was blamed for sampling from them; an audit); bases built before the hash was kept: unchecked
        expected = json.loads((folder / "populora_tiny_base.json").read_text()).get("model_sha256")
        if expected is not None and _sha256(folder / "model.safetensors") != expected:
            return "model.safetensors is not the file that was built (its SHA-256 differs)"
    except Exception as error:  # safetensors, tokenizers and json each raise their own kind
        return f"{type(error).__name__}: {str(error)[:200]}"
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _remove(path: Path) -> None:
    """Removes what ``path`` is, a folder, a file or a link (``rmtree`` left files and links behind)."""
    if path.is_symlink() or path.is_file():
        with contextlib.suppress(OSError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def _remove_stale_builds(root: Path, key: str) -> None:
    """Delete temporary build directories of ``key`` left by processes that no longer exist."""
    for path in root.glob(f".tmp-{key}-*"):
        try:
            pid = int(path.name.split("-")[2])
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove(path)
        except (ValueError, IndexError, PermissionError):
            continue


def _build_into(out_dir: Path, config: TinyBaseConfig, progress: bool) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    texts = [example.text for example in generate_examples(config.corpus_documents, config.seed)]
    tokenizer = _train_tokenizer(texts, config.vocab_size)
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    # Initial weights from the config's seed without touching the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(model_config)
    _pretrain(model, tokenizer, texts, config, progress)
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    import transformers

    # transformers' own "Writing model shards" bar broke up the build's lines (populora train hid it, base
    # build and example 02 did not; an audit): off for this local write, restored after
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()


def _train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """Byte-level BPE (GPT-2 style) trained on the corpus; every text round-trips through it exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    pad, bos, eos, unk = SPECIAL_TOKENS
    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Every encoded text starts with <s>, as every pretraining document did.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=pad, bos_token=bos, eos_token=eos, unk_token=unk, padding_side="left"
    )


def _pretrain(model: Any, tokenizer: Any, texts: list[str], config: TinyBaseConfig, progress: bool) -> None:
    """Causal-LM pretraining on packed documents: AdamW, linear warmup then cosine decay, clip 1.0."""
    from tqdm.auto import tqdm

    ids: list[int] = []
    for encoded in tokenizer(texts)["input_ids"]:
        ids.extend([*encoded, tokenizer.eos_token_id])
    n_rows = len(ids) // config.seq_len
    if n_rows < 1:
        raise ValueError(
            f"TinyBaseConfig.corpus_documents is too small: {config.corpus_documents} documents make "
            f"{len(ids)} tokens, fewer than one training sequence of seq_len {config.seq_len}"
        )
    data = torch.tensor(ids[: n_rows * config.seq_len]).view(n_rows, config.seq_len)  # (R, L)
    rng = random.Random(f"pretrain:{config.seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)

    def lr_factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        done = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    bar = tqdm(range(config.steps), desc="tiny base pretraining", disable=not (progress and watched()))
    for _ in bar:
        rows = torch.tensor([rng.randrange(n_rows) for _ in range(config.batch_size)])
        batch = data[rows]  # (batch, L)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(config.bf16_autocast)):
            loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
