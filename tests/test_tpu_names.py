"""TPU resource names and label values: valid, deterministic, collision free.

hypothesis is not installed in this venv, so the property checks run over large generated
sets (random plus adversarial inputs: ids that slug to the same text, long ids sharing a
prefix, unicode, punctuation only).
"""

from __future__ import annotations

import random
import string

import pytest

from accelmatrix.backends import tpu_names
from accelmatrix.backends.tpu_names import (
    MAX_NAME_LEN,
    is_valid_label_key,
    is_valid_label_value,
    is_valid_name,
    label_key,
    label_value,
    managed_labels,
    node_name,
)

ALPHABET = string.ascii_letters + string.digits + "_-.:+=,/ é漢"


def _rand(rng: random.Random, lo: int = 0, hi: int = 120) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(lo, hi)))


def _adversarial() -> list[tuple[str, str, str]]:
    base = "x" * 70
    cases = [
        ("d", "r", "model=a"),
        ("d", "r", "model-a"),  # same slug as model=a
        ("d", "r", "MODEL=A"),
        ("d", "r", "model_a"),
        ("d", "r", "model.a"),
        ("D", "r", "model=a"),
        ("d", "R", "model=a"),
        ("d-r", "", "model=a"),  # shifting text between fields must not collide
        ("d", "-r", "model=a"),
        ("", "", ""),
        ("___", "...", "///"),
        ("漢字", "é", "ü"),
        ("-leading", "r", "trailing-"),
        ("9starts-with-digit", "r", "1"),
    ]
    cases += [(base, "r", f"{base}{i}") for i in range(50)]  # truncated to the same prefix
    cases += [(f"{base}{i}", "r", base) for i in range(50)]
    cases += [("d", f"manual__2026-01-01T00:00:{i:02d}+00:00", "c") for i in range(60)]
    return cases


def test_names_are_valid_deterministic_and_distinct():
    rng = random.Random(1234)
    cases = _adversarial()
    cases += [(_rand(rng), _rand(rng), _rand(rng)) for _ in range(5000)]
    cases = list(dict.fromkeys(cases))  # distinct identities
    names = {}
    for dag, run, cell in cases:
        name = node_name(dag, run, cell)
        assert is_valid_name(name), (dag, run, cell, name)
        assert len(name) <= MAX_NAME_LEN
        assert name == node_name(dag, run, cell)  # a retry finds the same node
        assert name not in names, f"collision: {(dag, run, cell)} and {names[name]} -> {name}"
        names[name] = (dag, run, cell)


def test_name_is_readable_and_attempt_is_optional():
    name = node_name("tpu_smoke", "manual__2026-11-22T05:31:23+00:00", "model=tiny-mlp,chips=4")
    assert name.startswith("am-tpu-smoke-model-tiny-mlp-chips-4-")
    assert len(name.rsplit("-", 1)[1]) == tpu_names.HASH_LEN
    a1 = node_name("d", "r", "c", attempt=1)
    assert a1 != node_name("d", "r", "c") and a1 != node_name("d", "r", "c", attempt=2)
    assert "-a1-" in a1
    # Long inputs keep a readable start of both dag and cell.
    long = node_name("a_very_long_dag_identifier_" * 3, "r", "model=" + "m" * 80)
    assert long.startswith("am-a-very-long-dag") and "-model-mmm" in long
    assert len(long) == MAX_NAME_LEN


@pytest.mark.parametrize("max_len", [24, 40, 63])
def test_max_len_is_honoured(max_len):
    rng = random.Random(max_len)
    for _ in range(500):
        name = node_name(_rand(rng, 1), _rand(rng), _rand(rng, 1), max_len=max_len)
        assert is_valid_name(name) and len(name) <= max_len


def test_bad_arguments():
    with pytest.raises(ValueError):
        node_name("d", "r", "c", max_len=64)
    with pytest.raises(ValueError):
        node_name("d", "r", "c", max_len=10)
    with pytest.raises(ValueError):
        node_name("d", "r", "c", prefix="Bad")


@pytest.mark.parametrize(
    "name,ok",
    [
        ("a", True),
        ("a-b-1", True),
        ("1a", False),
        ("a-", False),
        ("A", False),
        ("a_b", False),
        ("a" * 63, True),
        ("a" * 64, False),
        ("", False),
    ],
)
def test_is_valid_name(name, ok):
    assert is_valid_name(name) is ok


def test_label_values_and_keys():
    rng = random.Random(99)
    seen: dict[str, str] = {}
    inputs = [_rand(rng, 0, 200) for _ in range(5000)]
    inputs += ["x" * 100 + str(i) for i in range(100)]  # long values differing at the end
    for text in dict.fromkeys(inputs):
        v = label_value(text)
        assert is_valid_label_value(v), (text, v)
        assert v == label_value(text)
        k = label_key(text)
        assert is_valid_label_key(k), (text, k)
        if len(text) > 63:  # shortened values keep a hash: different long inputs stay apart
            assert seen.setdefault(v, text) == text
    assert label_value("manual__2026-11-22T05:31:23.482877+00:00") == (
        "manual__2026-11-22t05_31_23_482877_00_00"
    )
    assert label_value("") == "" and label_key("") == "k" and label_key("9x") == "k9x"


def test_managed_labels():
    labels = managed_labels(
        "Tpu Smoke",
        "manual__2026-01-01T00:00:00+00:00",
        "model=a",
        1_900_000_000.7,
        {"Team": "ML Infra", "managed-by": "someone-else", "ttl": "0"},
    )
    assert labels["managed-by"] == "accelmatrix" and labels["ttl"] == "1900000000"
    assert labels["dag"] == "tpu_smoke" and labels["cell"] == "model_a"
    assert labels["team"] == "ml_infra"
    for k, v in labels.items():
        assert is_valid_label_key(k) and is_valid_label_value(v)
    with pytest.raises(ValueError):
        managed_labels("d", "r", "c", 0, {f"k{i}": "v" for i in range(70)})
