"""A population of LoRA adapters on one shared frozen base, with batched mixed-adapter generation.

Memory is the base once plus ``N`` small adapters (not ``N`` models). Every adapter is a named PEFT LoRA
adapter of one ``peft.PeftModel``; on disk each is saved in PEFT's own format (``save_pretrained``), so
``PeftModel.from_pretrained(base, <run_dir>/<adapters_dir>/<name>)`` loads it without this package
(``adapters_dir`` as named in the run's ``population.json``).

Genomes for ``evolve`` are PEFT state dicts of one adapter (keys ``...lora_A.weight`` of shape ``(r, in)``
and ``...lora_B.weight`` of shape ``(out, r)``, adapter name stripped, as in ``get_peft_model_state_dict``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch

from agents._checks import is_int, is_number, plain_number
from agents.base import load_base
from agents.batched_lora import lora_linear_layers, stacked_lora
from agents.generation import decode_tokens, stop_token_ids, texts_of
from agents.policy import LoRAPolicy
from evolve.checkpoint import atomic_write_bytes, fsync_tree
from populora_env.text_format import lone_surrogate

Strategy = Literal["stacked", "peft_mixed", "loop"]
MANIFEST = "population.json"
MANIFEST_FORMAT = "populora-lora-population"
_SAVE_FOLDER = re.compile(r"adapters|adapters-[0-9a-f]{12}")
"""Adapter folders a manifest may name: version 1's, version 2's."""
_LEFT_BY_SAVE = re.compile(r"adapters-[0-9a-f]{12}|\.adapters-[0-9a-z_]+")
"""Folders only ``save`` makes (a bare ``adapters`` may be a user's: removed only when a manifest names it)."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,127}")  # (a folder's name when saved: 255 bytes at most)


class LoRAPopulation:
    """``N`` LoRA adapters by name on one frozen base model.

    Attributes:
        model: the ``peft.PeftModel`` holding every adapter.
        tokenizer: the base's tokenizer (pad token set, left padding).
        base_ref: the base's directory or Hub id, recorded in saved manifests.
    """

    def __init__(self, model: Any, tokenizer: Any, lora_config: Any, base_ref: str, seed: int = 0) -> None:
        """Wrap an existing PEFT model; use :meth:`from_pretrained` or :meth:`load` instead."""
        self.model = model
        self.tokenizer = tokenizer
        self.base_ref = base_ref
        self._lora_config = lora_config
        self._seed = seed
        self._enable_all_grads()

    # ----------------------------------------------------------------------------------------------------
    # Construction
    # ----------------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        base_dir: str | os.PathLike[str],
        names: Sequence[str],
        rank: int = 8,
        alpha: float | None = None,
        target_modules: Sequence[str] | str | None = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        seed: int = 0,
    ) -> LoRAPopulation:
        """Load the base and add one fresh adapter per name.

        Args:
            base_dir: base model directory or Hub id (see :func:`agents.base.load_base`).
            names: adapter names (at least one, unique, letters/digits/``_``/``-``).
            rank: LoRA rank ``r``.
            alpha: LoRA alpha; ``None`` means ``alpha = rank`` (scaling 1).
            target_modules: modules to adapt; ``None`` uses PEFT's default for the architecture
                (``q_proj``/``v_proj`` for Llama); ``"all-linear"`` adapts every linear layer.
            dtype: base dtype; ``None`` is bf16 where native, else fp32. Adapters are kept in fp32.
            device: device; ``None`` picks CUDA when available.
            seed: seeds each adapter's ``lora_A`` init (from the seed and the name); ``lora_B`` starts at 0.

        Returns:
            The population.
        """
        from peft import LoraConfig

        if isinstance(names, str):
            raise TypeError(f"names must be a sequence of adapter names, not the single string {names!r}")
        if not names:
            raise ValueError("names must hold at least one adapter name")
        rank, alpha, seed = plain_number(rank), plain_number(alpha), plain_number(seed)
        if not is_int(rank) or rank < 1:
            raise ValueError(f"rank must be an int >= 1, got {rank!r}")
        if alpha is not None and not (is_number(alpha) and alpha > 0):
            raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
        if not is_int(seed):
            raise ValueError(f"seed must be an int, got {seed!r}")
        base_ref = os.fspath(base_dir)
        if Path(base_ref).expanduser().is_dir():
            base_ref = str(Path(base_ref).expanduser().resolve())
        model, tokenizer = load_base(base_ref, dtype=dtype, device=device)
        # A LoRA update B @ A of a linear layer has rank at most min(in, out): a rank above every linear
        # layer's is no adapter at all, only memory (rank 100000 asked for tens of GB)
        widest = max(
            (min(m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)),
            default=0,
        )
        if widest and rank > widest:
            raise ValueError(
                f"rank must be <= {widest}, min(in, out) of the base's widest linear layer (the largest rank a "
                f"LoRA update of it can have), got {rank}"
            )
        targets = (
            target_modules
            if target_modules is None or isinstance(target_modules, str)
            else list(target_modules)
        )
        config = LoraConfig(
            r=rank,
            lora_alpha=alpha if alpha is not None else rank,  # type: ignore[arg-type]  # PEFT accepts floats
            target_modules=targets,
            lora_dropout=0.0,
        )
        population = cls._wrap(model, tokenizer, config, base_ref, seed, names[0])
        population._check_targets(target_modules)
        for name in names[1:]:
            population.add(name)
        return population

    def _check_targets(self, requested: Sequence[str] | str | None) -> None:
        """Every module the adapters wrap is a linear layer (what batched mixed-adapter generation
        supports), and every name asked for matched one (PEFT refuses only a list matching nothing).

        Raises:
            ValueError: naming the modules.
        """
        try:
            layers = {id(layer) for layer in lora_linear_layers(self.model)}
        except TypeError as error:
            raise ValueError(f"target_modules {requested!r} must name linear layers: {error}") from None
        if not layers:
            raise ValueError(f"target_modules {requested!r} matched no module of the base")
        if requested is not None and not isinstance(requested, str):  # a string is a regex or "all-linear"
            names = [n for n, m in self.model.named_modules() if id(m) in layers]
            # PEFT's rule for a list: a module matches a target it is named, or whose name ends with it
            unmatched = sorted(t for t in requested if not any(n == t or n.endswith(f".{t}") for n in names))
            if unmatched:
                raise ValueError(f"target_modules {unmatched} match no linear layer of the base")

    @classmethod
    def _wrap(
        cls, base: Any, tokenizer: Any, config: Any, base_ref: str, seed: int, first: str
    ) -> LoRAPopulation:
        from peft import get_peft_model

        _check_name(first, base)
        with torch.random.fork_rng(devices=[]):  # PEFT's init draws from the global RNG; keep it untouched
            model = get_peft_model(base, config, adapter_name=first)
        population = cls(model, tokenizer, config, base_ref, seed)
        population._init_adapter(first)
        return population

    def _init_adapter(self, name: str) -> None:
        """PEFT's init (kaiming-uniform A with a=sqrt(5), zero B) drawn from a generator seeded by the name."""
        digest = hashlib.sha256(f"{self._seed}:{name}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        with torch.no_grad():
            for key, param in self._params(name).items():
                if ".lora_A." in key:
                    # kaiming_uniform_(a=sqrt(5)) bound: sqrt(6 / ((1 + a^2) * fan_in)) = 1 / sqrt(fan_in)
                    bound = 1.0 / math.sqrt(param.shape[1])
                    values = torch.rand(param.shape, generator=generator) * (2 * bound) - bound
                    param.copy_(values)
                else:
                    param.zero_()

    # ----------------------------------------------------------------------------------------------------
    # Adapters by name
    # ----------------------------------------------------------------------------------------------------
    @property
    def adapter_names(self) -> list[str]:
        """Names of the adapters, in insertion order."""
        return list(self.model.peft_config)

    @property
    def device(self) -> torch.device:
        """Device of the model."""
        return next(self.model.parameters()).device

    def _check(self, name: str) -> None:
        if name not in self.model.peft_config:
            raise KeyError(f"unknown adapter {name!r}; the population has {self.adapter_names}")

    def add(self, name: str, genome: Mapping[str, torch.Tensor] | None = None) -> None:
        """Add a fresh adapter (seeded init, zero ``lora_B``), or one holding ``genome``.

        Raises:
            ValueError: the name is taken or not a valid adapter name, or the genome does not fit.
        """
        if name in self.model.peft_config:
            raise ValueError(f"adapter {name!r} already exists; remove it first")
        _check_name(name, self.model, taken=self.model.peft_config)
        with torch.random.fork_rng(devices=[]):
            self.model.add_adapter(name, self._lora_config)
        self._enable_all_grads()
        self._init_adapter(name)
        if genome is not None:
            try:
                self.set_genome(name, genome)
            except BaseException:  # refused (or interrupted): no half-made adapter stays behind
                self.remove(name)
                raise

    def remove(self, name: str) -> None:
        """Delete an adapter and its parameters.

        Raises:
            KeyError: unknown name.
            ValueError: it is the last adapter (a population keeps at least one).
        """
        self._check(name)
        if len(self.model.peft_config) == 1:
            raise ValueError(f"cannot remove {name!r}: a population keeps at least one adapter")
        if self.model.active_adapter == name:
            self.set_active(next(n for n in self.adapter_names if n != name))
        self.model.delete_adapter(name)
        self._enable_all_grads()

    def copy(self, source: str, target: str) -> None:
        """Add adapter ``target`` as an exact copy of ``source``."""
        self.add(target, self.get_genome(source))

    def _params(self, name: str) -> dict[str, torch.nn.Parameter]:
        """This adapter's LoRA parameters under PEFT's state-dict keys (adapter name stripped)."""
        self._check(name)
        marker = re.compile(rf"\.(lora_A|lora_B)\.{re.escape(name)}\.weight$")
        params = {}
        for key, param in self.model.named_parameters():
            if marker.search(key):
                params[marker.sub(r".\1.weight", key)] = param
        return params

    def get_genome(self, name: str) -> dict[str, torch.Tensor]:
        """Copies of an adapter's tensors: PEFT state-dict keys, ``lora_A`` ``(r, in)``, ``lora_B`` ``(out, r)``."""
        return {key: param.detach().clone() for key, param in self._params(name).items()}

    def set_genome(self, name: str, genome: Mapping[str, torch.Tensor]) -> None:
        """Overwrite an adapter's tensors from a genome with exactly its keys and shapes.

        Raises:
            KeyError: unknown adapter name.
            ValueError: missing/unexpected keys, a value that is not a floating-point tensor, a wrong shape,
                or non-finite values, also once cast to the adapter's dtype (nothing is changed).
        """
        params = self._params(name)
        missing, unexpected = sorted(set(params) - set(genome)), sorted(set(genome) - set(params))
        if missing or unexpected:
            raise ValueError(
                f"genome keys do not fit adapter {name!r}: missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
        for key, param in params.items():
            value = genome[key]
            if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.is_meta:
                raise ValueError(
                    f"genome {key} must be a floating-point tensor with data, got "
                    f"{getattr(value, 'dtype', None) or type(value).__name__}"
                    f"{' on the meta device' if isinstance(value, torch.Tensor) and value.is_meta else ''}"
                )
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(
                    f"genome {key} has shape {tuple(value.shape)}, adapter needs {tuple(param.shape)}"
                )
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"genome {key} holds non-finite values")
            if not bool(
                torch.isfinite(value.to(param.dtype)).all()
            ):  # (1e39 in float64 loaded as inf: a review)
                raise ValueError(f"genome {key} holds values beyond the range of the adapter's {param.dtype}")
        with torch.no_grad():
            for key, param in params.items():
                param.copy_(genome[key])

    def trainable_parameters(self, name: str) -> list[torch.nn.Parameter]:
        """The adapter's LoRA parameters (``requires_grad`` True); the base stays frozen."""
        return list(self._params(name).values())

    def set_active(self, name: str) -> None:
        """Make ``name`` the adapter used by a plain ``self.model(...)`` forward.

        Unlike PEFT's ``set_adapter``, the other adapters keep ``requires_grad`` True (they take no part in
        the forward, so they get no gradient), so optimizers built earlier stay valid.
        """
        self._check(name)
        self.model.set_adapter(name)
        self._enable_all_grads()

    def _enable_all_grads(self) -> None:
        for key, param in self.model.named_parameters():
            param.requires_grad_(".lora_A." in key or ".lora_B." in key)

    @contextmanager
    def reference(self) -> Iterator[None]:
        """Within the context the model runs as the frozen base (all adapters disabled, whatever the
        generation strategy). On exit every adapter's parameters require grad again (PEFT re-enables the
        active adapter's only)."""
        try:
            with self.model.disable_adapter():
                yield
        finally:
            self._enable_all_grads()

    # ----------------------------------------------------------------------------------------------------
    # Generation
    # ----------------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str],
        adapters: Sequence[str],
        max_new_tokens: int,
        temperature: float,
        seed: int,
        top_p: float = 1.0,
        *,
        strategy: Strategy = "stacked",
        ignore_eos: bool = False,
        share_prefill: bool = True,
    ) -> list[str]:
        """Generate one continuation per prompt, row ``i`` with adapter ``adapters[i]``.

        Args:
            prompts: the prompts.
            adapters: one adapter name per prompt.
            max_new_tokens: generation budget per prompt (>= 0).
            temperature: 0 for greedy decoding, > 0 to sample (reproducible for a fixed ``seed``).
            seed: seed of the local sampling generator.
            top_p: nucleus mass in ``(0, 1]``.
            strategy: ``stacked`` (one batch, gathered factors; the fast path), ``peft_mixed`` (one batch,
                PEFT's ``adapter_names=``) or ``loop`` (PEFT ``set_adapter`` per adapter, one sub-batch each,
                each sampling from its own seeded stream: greedy texts equal the others' in float32 (in
                bf16/fp16 a batch's make-up can turn a near tie after a few tokens), sampled ones differ
                from theirs).
            ignore_eos: keep generating past the stop tokens (fixed token counts for benchmarks).
            share_prefill: rows with the same prompt and adapter (a GRPO group) run the prompt once and
                share its KV cache (see :func:`agents.generation.decode_tokens`); same texts either way.

        Returns:
            The continuations, in prompt order.
        """
        rows = self.generate_tokens(
            prompts,
            adapters,
            max_new_tokens,
            temperature,
            seed,
            top_p,
            strategy=strategy,
            ignore_eos=ignore_eos,
            share_prefill=share_prefill,
        )
        return texts_of(self.tokenizer, rows, self.stop_ids)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The ids generation stops on (``agents.generation.stop_token_ids``): the tokenizer's EOS and the
        base's ``generation_config.eos_token_id``."""
        return stop_token_ids(self.model, self.tokenizer)

    def generate_tokens(
        self,
        prompts: Sequence[str],
        adapters: Sequence[str],
        max_new_tokens: int,
        temperature: float,
        seed: int,
        top_p: float = 1.0,
        *,
        strategy: Strategy = "stacked",
        ignore_eos: bool = False,
        share_prefill: bool = True,
    ) -> list[list[int]]:
        """Generate as :meth:`generate` (same arguments, same tokens) and return token ids instead of text.

        A learner given these trains on exactly the sampled tokens; re-tokenising the decoded text can split it
        differently under BPE, and drops sampled special tokens.

        Returns:
            Per prompt, the generated ids up to and including the first stop token
            (``agents.generation.stop_token_ids``; none when the row used its whole budget without
            stopping, or with ``ignore_eos``).
        """
        # numpy's numbers (a config read from an array) as Python's: the checks and torch take those
        max_new_tokens, temperature, top_p, seed = map(
            plain_number, (max_new_tokens, temperature, top_p, seed)
        )
        _check_generate_args(prompts, adapters, max_new_tokens, temperature, top_p, seed)
        if strategy not in ("stacked", "peft_mixed", "loop"):
            raise ValueError(f"strategy must be 'stacked', 'peft_mixed' or 'loop', got {strategy!r}")
        for name in dict.fromkeys(adapters):
            self._check(name)
        args: dict[str, Any] = dict(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            top_p=top_p,
            ignore_eos=ignore_eos,
            share_prefill=share_prefill,
        )
        was_training, active = self.model.training, self.model.active_adapter
        self.model.eval()
        try:
            if strategy == "loop":
                return self._generate_loop(prompts, adapters, args)
            setup = _stacked_setup if strategy == "stacked" else _peft_mixed_setup
            return decode_tokens(
                self.model,
                self.tokenizer,
                prompts,
                row_keys=adapters,
                row_setup=lambda rows: setup(self.model, [adapters[i] for i in rows]),
                **args,
            )
        finally:
            self.model.train(was_training)
            self.set_active(active)

    def _generate_loop(
        self, prompts: Sequence[str], adapters: Sequence[str], args: dict[str, Any]
    ) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in prompts]
        for index, name in enumerate(dict.fromkeys(adapters)):
            rows = [i for i, a in enumerate(adapters) if a == name]
            self.model.set_adapter(name)
            # Each sub-batch samples from its own stream: with the one seed, row j of every adapter drew
            # the same numbers (common random numbers across the population's rollouts).
            seed = _sub_batch_seed(args["seed"], index)
            generated = decode_tokens(
                self.model, self.tokenizer, [prompts[i] for i in rows], **{**args, "seed": seed}
            )
            for i, ids in zip(rows, generated, strict=True):
                out[i] = ids
        return out

    # ----------------------------------------------------------------------------------------------------
    # Persistence
    # ----------------------------------------------------------------------------------------------------
    def save(self, run_dir: str | os.PathLike[str]) -> Path:
        """Write every adapter in PEFT's format to a fresh folder ``run_dir/adapters-<id>/<name>``, then the
        manifest ``population.json`` naming that folder, then remove the folder the previous manifest named
        and the folders of interrupted saves (``adapters-<12 hex digits>``, ``.adapters-*``); nothing else in
        ``run_dir`` is touched.

        The adapters are written to a hidden folder first and renamed in whole; the manifest is replaced
        atomically (temporary file, fsync, rename) and is what :meth:`load` follows; the adapter files are
        fsynced before it. A save interrupted at any point (a kill, a full disk, a power loss) leaves the
        previous save loadable as it was, never a mix of two.

        Returns:
            The manifest path.
        """
        run = Path(run_dir)
        for path, what in ((run, "the folder to save in"), (run / MANIFEST, "the manifest a save writes")):
            if path.exists() and path.is_dir() != (path == run):  # (found before any adapter is written)
                raise ValueError(f"{path} is a {'folder' if path.is_dir() else 'file'}, not {what}")
        run.mkdir(parents=True, exist_ok=True)
        try:
            previous: Path | None = _read_manifest(run)[1]
        except (OSError, ValueError):  # no manifest, or not one of ours: nothing of an earlier save to remove
            previous = None
        staging = Path(tempfile.mkdtemp(prefix=".adapters-", dir=run))
        folder = f"adapters-{uuid.uuid4().hex[:12]}"
        try:
            for name in self.adapter_names:
                # PEFT writes a non-"default" adapter to <dir>/<name>; "default" goes to <dir> itself.
                self.model.save_pretrained(
                    staging if name != "default" else staging / name, selected_adapters=[name]
                )
            fsync_tree(staging)  # on disk before the manifest names it and the previous save goes
            os.replace(staging, run / folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": 2,
            "base": self.base_ref,
            "adapters_dir": folder,
            "adapters": self.adapter_names,
            "active": self.model.active_adapter,
            "seed": self._seed,
        }
        atomic_write_bytes(run / MANIFEST, json.dumps(manifest, indent=2).encode())
        if previous is not None and previous.name != folder:
            shutil.rmtree(previous, ignore_errors=True)
        for old in run.iterdir():  # folders of saves interrupted before their manifest, or their rename
            if old.name != folder and old.is_dir() and _LEFT_BY_SAVE.fullmatch(old.name):
                shutil.rmtree(old, ignore_errors=True)
        return run / MANIFEST

    @classmethod
    def load(
        cls,
        run_dir: str | os.PathLike[str],
        *,
        base: str | os.PathLike[str] | None = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
    ) -> LoRAPopulation:
        """Load a population written by :meth:`save`.

        Args:
            run_dir: the directory given to :meth:`save`.
            base: the base directory or Hub id; ``None`` uses the one recorded in the manifest.
            dtype: base dtype (see :meth:`from_pretrained`).
            device: target device.

        Raises:
            FileNotFoundError: no manifest in ``run_dir``, or an adapter it lists is missing.
            ValueError: a manifest that is not one of :meth:`save`'s, or an adapter that does not load
                (both naming the file).
        """
        from peft import PeftModel

        run = Path(run_dir)
        manifest, folder = _read_manifest(run)
        base_ref = os.fspath(base) if base is not None else manifest["base"]
        names = manifest["adapters"]
        for name in names:
            for file in ("adapter_config.json", "adapter_model.safetensors"):
                if not (folder / name / file).is_file():
                    raise FileNotFoundError(
                        f"adapter {name!r} listed in {run / MANIFEST} has no {folder / name / file}"
                    )
        model, tokenizer = load_base(base_ref, dtype=dtype, device=device)
        peft_model: Any = model
        for index, name in enumerate(names):
            try:
                if index == 0:
                    peft_model = PeftModel.from_pretrained(
                        model, folder / name, adapter_name=name, is_trainable=True
                    )
                else:
                    peft_model.load_adapter(folder / name, adapter_name=name, is_trainable=True)
            except Exception as error:  # a truncated or foreign file: say which adapter and where
                raise ValueError(
                    f"adapter {name!r} in {folder / name} does not load: {type(error).__name__}: {error}"
                ) from error
        peft_model.set_adapter(manifest["active"])
        population = cls(peft_model, tokenizer, peft_model.peft_config[names[0]], base_ref, manifest["seed"])
        for name in names:
            population._check_loaded(name, folder / name / "adapter_model.safetensors")
        return population

    def _check_loaded(self, name: str, path: Path) -> None:
        """``ValueError`` naming the file unless it held exactly the adapter's tensors, all finite: PEFT loads a
        file missing some (they keep their fresh initialisation: zeros for ``lora_B``, random ``lora_A``) or
        holding others (ignored) without a word, and NaNs as they are (a robustness review)."""
        from safetensors import safe_open

        params = self._params(name)
        with safe_open(os.fspath(path), framework="pt") as saved:
            keys = set(saved.keys())
            missing, unexpected = sorted(set(params) - keys), sorted(keys - set(params))
            if missing or unexpected:
                raise ValueError(
                    f"adapter {name!r} in {path} does not hold its tensors: missing {missing[:3]}, unexpected "
                    f"{unexpected[:3]}"
                )
        for key, param in params.items():
            if not bool(torch.isfinite(param).all()):
                raise ValueError(f"adapter {name!r} in {path} holds non-finite values at {key}")

    def policy(self, name: str, **kwargs: Any) -> LoRAPolicy:
        """A ``populora_env.Policy`` answering with adapter ``name``; kwargs as :class:`LoRAPolicy`
        (``max_new_tokens``, ``temperature``, ``seed``, ``top_p``, ``prefill``).

        Raises:
            KeyError: unknown adapter name (listing the names).
        """
        self._check(name)
        return LoRAPolicy(self, name, **kwargs)


@contextmanager
def _stacked_setup(model: Any, row_adapters: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Row setup of the ``stacked`` strategy: gathered LoRA factors per row, no extra forward arguments."""
    with stacked_lora(model, row_adapters):
        yield {}


@contextmanager
def _peft_mixed_setup(model: Any, row_adapters: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Row setup of the ``peft_mixed`` strategy: PEFT's ``adapter_names=`` on every forward."""
    yield {"adapter_names": list(row_adapters)}


#: Parts of the names PEFT gives an adapted model's modules and parameters, whatever the base.
_PEFT_PARTS = frozenset(
    {"base_model", "model", "base_layer", "weight", "bias", "lora_A", "lora_B", "lora_embedding_A",
     "lora_embedding_B", "lora_dropout", "lora_magnitude_vector"}
)  # fmt: skip


def _check_name(name: str, model: torch.nn.Module, taken: Iterable[str] = ()) -> None:
    """An adapter name: ``_NAME``, and no part of a module's or parameter's name (PEFT names an adapter's
    factors ``<module>.lora_A.<name>.weight``: an adapter named ``weight``, ``layers`` or ``q_proj`` made
    ``save`` write the other adapters' files with keys they do not hold, and the previous save was gone, a
    review)."""
    # fullmatch: `$` let a trailing newline through, and the saved folder's name held it (a robustness review)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"adapter name {name!r} must match {_NAME.pattern}")
    names = [key for key, _ in model.named_modules()] + [key for key, _ in model.named_parameters()]
    parts = (_PEFT_PARTS | {part for key in names for part in key.split(".")}) - set(taken)
    if name in parts:
        raise ValueError(
            f"adapter name {name!r} is a part of the model's module and parameter names (PEFT would write the "
            "adapters' files under keys that do not load back): choose another"
        )


def _check_generate_args(
    prompts: Sequence[str],
    adapters: Sequence[str],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
) -> None:
    if isinstance(prompts, str) or isinstance(adapters, str):
        raise TypeError("prompts and adapters must be sequences of strings, not a single string")
    if len(prompts) != len(adapters):
        raise ValueError(f"need one adapter per prompt: {len(prompts)} prompts, {len(adapters)} adapters")
    if bad := [i for i, prompt in enumerate(prompts) if not isinstance(prompt, str)]:
        raise TypeError(f"prompts must be strings; prompt {bad[0]} is {type(prompts[bad[0]]).__name__}")
    for i, prompt in enumerate(prompts):  # the tokenizer's own error names neither prompt nor character
        if (at := lone_surrogate(prompt)) is not None:
            raise ValueError(
                f"prompt {i} is not valid Unicode: a lone surrogate {prompt[at]!r} at character {at} (text "
                "decoded with errors='surrogateescape'?); no tokenizer encodes it"
            )
    if not is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not (is_number(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not (is_number(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
    if not (is_int(seed) and -(2**63) <= seed < 2**64):  # what torch.Generator.manual_seed takes
        raise ValueError(f"seed must be an int in [-2**63, 2**64), got {seed!r}")


def _read_manifest(run: Path) -> tuple[dict[str, Any], Path]:
    """The manifest of a saved population and its adapters folder, checked field by field."""
    path = run / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no population manifest {MANIFEST} in {run}")
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a population manifest (not JSON: {error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path} is not a population manifest (format is not {MANIFEST_FORMAT!r})")
    if manifest.get("version") not in (1, 2):
        raise ValueError(f"{path}: version {manifest.get('version')!r} is not one this package reads (1, 2)")
    names = manifest.get("adapters")
    if not (
        isinstance(names, list) and names and all(isinstance(n, str) and _NAME.fullmatch(n) for n in names)
    ):
        raise ValueError(f"{path}: 'adapters' must be a non-empty list of adapter names, got {names!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: 'adapters' lists a name twice: {names}")
    manifest.setdefault("active", names[0])
    if manifest["active"] not in names:
        raise ValueError(f"{path}: 'active' {manifest['active']!r} is not among the adapters {names}")
    manifest.setdefault("seed", 0)
    if not isinstance(manifest["seed"], int) or isinstance(manifest["seed"], bool):
        raise ValueError(f"{path}: 'seed' must be an int, got {manifest['seed']!r}")
    if not isinstance(manifest.get("base"), str):
        raise ValueError(f"{path}: 'base' must be a path or Hub id, got {manifest.get('base')!r}")
    folder = manifest.get("adapters_dir", "adapters")  # version 1 wrote every save to "adapters"
    if not (isinstance(folder, str) and _SAVE_FOLDER.fullmatch(folder)):
        raise ValueError(f"{path}: 'adapters_dir' must name an adapters folder of {run}, got {folder!r}")
    return manifest, run / folder


def _sub_batch_seed(seed: int, index: int) -> int:
    """The sampling seed of the ``loop`` strategy's ``index``-th adapter sub-batch: ``seed`` for the first (one
    adapter samples as in the one-batch strategies), a 63-bit hash of both for the others."""
    if index == 0:
        return seed
    digest = hashlib.sha256(f"populora-loop:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
