"""One number reader for every box, flag and file field (csd.numbers): the same words for the same mistakes,
the field named, large numbers written one way."""
from __future__ import annotations

import pytest

from csd.memory import MemoryPolicy, policy_from
from csd.numbers import CAPACITY, Field, NumberError, grouped

CAP = "the memory capacity must be a whole number from 1 to 100,000,000"


@pytest.mark.parametrize("typed, got", [("abc", 'got "abc"'), ("1e9", 'got "1e9"'), (1e9, "got 1,000,000,000"),
                                        ("2.5", 'got "2.5"'), (2.5, "got 2.5"), ("0", 'got "0"'), (0, "got 0"),
                                        ("-", 'got "-"'), (True, "got True"), (float("nan"), "got nan")])
def test_abc_1e9_2_5_and_0_are_refused_in_one_sentence_naming_the_field(typed, got):
    with pytest.raises(NumberError) as e:
        CAPACITY.read(typed)
    assert str(e.value) == f"{CAP}; {got}."


def test_numbers_in_range_are_read_as_typed():
    assert [CAPACITY.read(v) for v in ("300", 300.0, " 1,000 ", "", None)] == [300, 300, 1000, None, None]
    assert Field("γ", 1, 32, whole=True).read("4") == 4 and Field("τ", -4, 0).read("-0.5") == -0.5
    with pytest.raises(NumberError, match="γ must be a whole number from 1 to 32; got nothing."):
        Field("γ", 1, 32, whole=True).read(None)


def test_the_flags_the_boxes_and_the_file_read_the_same_way():
    """policy_from (flags, boxes) and MemoryPolicy (a file's block) refuse 1e9 with the same words, by their name."""
    for names in (("--memory-capacity", "--memory-half-life"), ("Memory capacity", "Memory half-life")):
        with pytest.raises(ValueError, match=f"^{names[0]} must be a whole number from 1 to 100,000,000; got"):
            policy_from("1e9", None, names)
        with pytest.raises(ValueError, match=f"^{names[1]} must be between 1 and 100,000,000; got"):
            policy_from(None, 1e9, names)
    with pytest.raises(ValueError, match=f"^{CAP}; got 1,000,000,000."):
        MemoryPolicy(capacity=10 ** 9)


def test_large_numbers_are_written_one_way():
    assert grouped(1e9) == "1,000,000,000" and grouped(10 ** 9) == "1,000,000,000" and grouped(0.01) == "0.01"
    p = MemoryPolicy(capacity=100_000_000, half_life=100_000_000)
    assert p.describe() == ("capacity 100,000,000 patterns (the smallest count goes), counts halve every "
                            "100,000,000 divergences")
    assert "e+" not in p.label
