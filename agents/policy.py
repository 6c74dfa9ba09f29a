"""``LoRAPolicy``: one adapter of a ``LoRAPopulation`` as a text-mode ``Policy`` for ``TeacherStudent-v0``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agents._checks import is_int, is_number, plain_number
from agents.generation import texts_of
from populora_env.tasks import TASK_TYPES
from populora_env.text_format import format_answer, format_proposal

# Separator between prompt and answer in the tiny base's corpus (``agents.corpus.Example.answer``).
ANSWER_SEPARATOR = "\n\n"
MAX_KEPT_IDS = 65_536
"""Most (prompt, completion) -> token ids entries a ``keep_ids`` policy holds (oldest dropped first)."""
_PHASES = {1: "propose", 2: "solve"}  # the env's ``phase`` field (0 is idle)


class GeneratingPopulation(Protocol):
    """What a policy needs from a population (``agents.population.LoRAPopulation`` has it)."""

    def generate(
        self,
        prompts: Sequence[str],
        adapters: Sequence[str],
        max_new_tokens: int,
        temperature: float,
        seed: int,
        top_p: float = 1.0,
    ) -> list[str]: ...


def generate_with_ids(
    population: GeneratingPopulation, prompts: Sequence[str], *, want_ids: bool = True, **args: Any
) -> tuple[list[str], list[list[int]] | None]:
    """``population.generate(prompts, **args)`` and, when wanted and the population can give them
    (``generate_tokens`` and a ``tokenizer``), the sampled token ids of each text (else ``None``).

    The texts are the same either way: ``generate`` is ``generate_tokens`` decoded.
    """
    generate_tokens = getattr(population, "generate_tokens", None)
    tokenizer = getattr(population, "tokenizer", None)
    if not want_ids or generate_tokens is None or tokenizer is None:
        return list(population.generate(prompts, **args)), None
    rows = [list(ids) for ids in generate_tokens(prompts, **args)]
    return texts_of(tokenizer, rows, getattr(population, "stop_ids", None)), rows


def prompt_of(observation: Any) -> str:
    """The model input for a text-mode observation: the env's own ``prompt`` field, unchanged.

    The env writes the whole prompt (task, references and AZR's answer format, see
    ``populora_env.text_format``), so nothing is added here.

    Raises:
        TypeError: the observation is not a text-mode observation (a mapping with a string ``prompt``).
    """
    prompt = observation.get("prompt") if isinstance(observation, Mapping) else None
    if not isinstance(prompt, str):
        raise TypeError(
            "LoRAPolicy needs a text-mode observation (a dict with a string 'prompt'); "
            f"got {type(observation).__name__}. Create the env with mode='text'."
        )
    return prompt


def answer_prefill(observation: Any) -> str:
    """The opening of the env's answer format up to the first block's body, for a prefilled response.

    Built with the env's own formatters (``format_answer`` / ``format_proposal`` with empty reasoning), e.g.
    ``"\\n\\n<think></think>\\n<answer>\\n```output\\n"`` for a deduction answer; empty for an idle
    observation. Prefilling spares a weak base (the tiny offline one) the scaffold, so that its samples
    differ in what matters to the verifier; the env still parses the whole text, scaffold included.
    """
    phase = _PHASES.get(int(observation.get("phase", 0))) if isinstance(observation, Mapping) else None
    if phase is None:
        return ""
    task_type = TASK_TYPES[int(observation["task_type"])]
    marker = "\x00"  # not in the env's charset, so it cannot occur in the formatted text
    text = format_answer(task_type, marker) if phase == "solve" else format_proposal(marker, ["()"])
    return ANSWER_SEPARATOR + text[: text.index(marker)]


def model_input(observation: Any, prefill: bool) -> tuple[str, str]:
    """The text given to the model for an observation, and the prefilled start of its answer.

    Returns:
        ``(prompt, prefix)``: the model continues ``prompt + prefix``; the env's action is ``prefix`` plus
        the continuation. ``prefix`` is empty unless ``prefill``.
    """
    prompt = prompt_of(observation)
    prefix = answer_prefill(observation) if prefill else ""
    return prompt + prefix, prefix


class LoRAPolicy:
    """A ``populora_env.Policy`` that answers with one adapter of a LoRA population.

    ``act`` and ``act_batch`` return the raw generated text: an empty, malformed or over-long generation
    is returned as it is, and the env scores it as a format error (it never raises on model output).

    Sampling is reproducible: call ``k`` of the policy (``act`` or ``act_batch``) samples with seed
    ``seed + k``, so a policy replays the same texts after ``reseed`` with the same seed.

    Args:
        population: the population holding the adapter.
        adapter: the adapter's name.
        max_new_tokens: generation budget per action (>= 0).
        temperature: 0 for greedy decoding, > 0 to sample.
        seed: base seed of the sampling generator.
        top_p: nucleus mass in ``(0, 1]``.
        prefill: start every answer with the env's answer scaffold (see :func:`answer_prefill`).
        keep_ids: remember the sampled token ids of each (prompt, completion) until ``reseed`` (at most
            ``MAX_KEPT_IDS`` of them), so a learner can train on exactly the sampled tokens
            (:meth:`sampled_ids`); needs a population with ``generate_tokens``.
    """

    def __init__(
        self,
        population: GeneratingPopulation,
        adapter: str,
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        seed: int = 0,
        top_p: float = 1.0,
        prefill: bool = False,
        keep_ids: bool = False,
    ) -> None:
        names = getattr(population, "adapter_names", None)
        if names is not None and adapter not in names:
            raise KeyError(f"unknown adapter {adapter!r}; the population has {list(names)}")
        max_new_tokens, temperature, top_p, seed = map(
            plain_number, (max_new_tokens, temperature, top_p, seed)
        )
        if not (is_int(max_new_tokens) and max_new_tokens >= 0):
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if not (is_number(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature!r}")
        if not (is_number(top_p) and 0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        # each act seeds seed + its count: a seed near 2**64 failed at the second act, in mid-episode (a review)
        if not (is_int(seed) and -(2**63) <= seed < 2**63):
            raise ValueError(f"seed must be an int in [-2**63, 2**63), got {seed!r}")
        self.population = population
        self.adapter = adapter
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.prefill = prefill
        self.keep_ids = keep_ids
        self._calls = 0
        self._ids: OrderedDict[tuple[str, str], list[int]] = OrderedDict()

    def reseed(self, seed: int) -> None:
        """Restarts the policy's sampling seeds from ``seed``."""
        self.seed = seed
        self._calls = 0
        self._ids.clear()

    def act(self, observation: Any, agent: str) -> str:
        """The generated answer of ``agent`` to one text-mode observation."""
        return self.act_batch([observation], [agent])[0]

    def act_batch(self, observations: Sequence[Any], agents: Sequence[str]) -> list[str]:
        """Answers to several observations in one batched generation (one row per observation).

        Args:
            observations: text-mode observations.
            agents: the acting agent of each observation (every row uses this policy's adapter).

        Returns:
            One generated text per observation, in order.
        """
        if len(observations) != len(agents):
            raise ValueError(f"need one agent per observation: {len(observations)} vs {len(agents)}")
        inputs = [model_input(obs, self.prefill) for obs in observations]
        seed = self.seed + self._calls
        self._calls += 1
        if not inputs:
            return []
        args: dict[str, Any] = dict(
            adapters=[self.adapter] * len(inputs),
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seed=seed,
            top_p=self.top_p,
        )
        prompts = [prompt for prompt, _ in inputs]
        texts, rows = generate_with_ids(self.population, prompts, want_ids=self.keep_ids, **args)
        for prompt, text, ids in zip(prompts, texts, rows or [], strict=False):
            self._ids[(prompt, text)] = ids
            while len(self._ids) > MAX_KEPT_IDS:
                self._ids.popitem(last=False)
        return [prefix + text for (_, prefix), text in zip(inputs, texts, strict=True)]

    def sampled_ids(self, prompt: str, completion: str) -> list[int] | None:
        """The token ids sampled for ``completion`` after ``prompt`` (the model input, prefill included)
        since the last ``reseed``; ``None`` if not kept (``keep_ids=False`` or not generated here). Two
        samples that decode to the same text share the later one's ids (both spell that text)."""
        return self._ids.get((prompt, completion))
