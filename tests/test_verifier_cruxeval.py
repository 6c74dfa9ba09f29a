"""External check: the 800 CRUXEval triples (code, input, output) through the real verifier."""

from __future__ import annotations

import json

import pytest

from populora_env.verifier import canonical_text, parse_literal

from .conftest import CRUXEVAL


def perturb(value):
    """A plain value that is certainly != ``value`` (a changed leaf, not a wrapper)."""
    if type(value) is bool:
        return not value
    if type(value) is int:
        return value + 1
    if type(value) is float:
        return value + 1.5
    if type(value) in (str, bytes):
        return value + type(value)("~", "ascii") if type(value) is bytes else value + "~"
    if type(value) is complex:
        return value + 1j
    if value is None:
        return 0
    if type(value) is list:
        return [perturb(value[0]), *value[1:]] if value else [0]
    if type(value) is tuple:
        return (perturb(value[0]), *value[1:]) if value else (0,)
    if type(value) is dict:
        if value:
            key = next(iter(value))
            return {**value, key: perturb(value[key])}
        return {0: 0}
    if type(value) in (set, frozenset):
        return set(value) | {"~perturbed~"}
    raise TypeError(type(value))


@pytest.fixture(scope="module")
def triples():
    if not CRUXEVAL.exists():
        pytest.skip(f"CRUXEval data not found at {CRUXEVAL} (set POPULORA_CRUXEVAL to its path)")
    with CRUXEVAL.open() as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.slow
def test_all_800_cruxeval_triples_verify(verifier, triples):
    assert len(triples) == 800
    # 12 stated inputs are expressions (`dict(a=1)`, `''.join(...)`, lambdas): evaluated in the sandbox.
    executions = verifier.run_many([(t["code"], t["input"]) for t in triples], expression_args=True)
    failures = [(t["id"], e) for t, e in zip(triples, executions) if not e.ok]
    assert failures == []
    for t, e in zip(triples, executions):
        assert parse_literal(e.output) == parse_literal(t["output"]), t["id"]


@pytest.mark.slow
def test_cruxeval_output_and_input_prediction(verifier, triples):
    literal_inputs = verifier.literalize_many([(t["code"], t["input"]) for t in triples])
    usable = [(t, i.output) for t, i in zip(triples, literal_inputs) if i.ok]
    # Inputs holding a lambda or a range cannot be written as literal answers; nothing else may fail.
    assert sorted(t["id"] for t, i in zip(triples, literal_inputs) if not i.ok) == [
        "sample_344", "sample_364", "sample_522",
    ]  # fmt: skip
    verifier.run_many([(t["code"], args) for t, args in usable])  # one parallel batch; checks hit the cache
    for t, args in usable:
        code, stated_output = t["code"], t["output"]
        # output prediction: the stated output is accepted, a perturbed one rejected
        assert verifier.check_deduction(code, args, stated_output), t["id"]
        wrong = canonical_text(perturb(parse_literal(stated_output)))
        assert not verifier.check_deduction(code, args, wrong), (t["id"], wrong)
        # input prediction: the stated input (as a literal) is accepted
        assert verifier.check_abduction(code, stated_output, args), t["id"]
