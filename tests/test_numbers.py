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


# -- the command line's number flags: argparse types built from csd.config's fields ---------------------------------
def parse(argv: list[str], capsys) -> str:
    """What the real parser of ``python -m csd`` says to ``argv`` that it refuses (it exits with 2, as for any bad
    flag, before anything loads)."""
    from csd.cli import build_parser
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


GENERATE = ["generate", "--prompt", "hi"]
# (the command, the flag, the field it reads, the values out of its range among 'abc', 1e9, 2.5 and 0)
FLAGS = [(GENERATE, "--gamma", "GAMMA", ("abc", "1e9", "2.5", "0")),
         (GENERATE, "--gamma-max", "GAMMA_MAX", ("abc", "1e9", "2.5", "0")),
         (GENERATE, "--lam", "LAM", ("abc",)),
         (GENERATE, "--tau", "TAU", ("abc", "1e9", "2.5", "0")),
         (GENERATE, "--temperature", "TEMPERATURE", ("abc",)),
         (GENERATE, "--max-new-tokens", "MAX_NEW_TOKENS", ("abc", "2.5", "0")),
         (GENERATE, "--lookup", "LOOKUP", ("abc", "1e9", "2.5")),
         (GENERATE, "--lookup-ngram", "LOOKUP_NGRAM", ("abc", "1e9", "2.5", "0")),
         (GENERATE, "--seed", "SEED", ("abc", "2.5")),
         (["bench"], "--gamma", "GAMMA", ("abc", "1e9", "2.5", "0")),
         (["bench"], "--gamma-max", "GAMMA_MAX", ("abc", "1e9", "2.5", "0")),
         (["bench"], "--lam", "LAM", ("abc",)),
         (["bench"], "--tau", "TAU", ("abc", "1e9", "2.5", "0")),
         (["bench"], "--max-new-tokens", "MAX_NEW_TOKENS", ("abc", "2.5", "0")),
         (["bench"], "--lookup", "LOOKUP", ("abc", "1e9", "2.5")),
         (["bench"], "--seed", None, ("abc", "2.5")),
         (["memory", "export", "t.json", "--format", "sglang"], "--lam", "LAM", ("abc",)),
         (["memory", "export", "t.json", "--format", "sglang"], "--tau", None, ("abc", "0"))]


@pytest.mark.parametrize("command, flag, field, bad", FLAGS, ids=[f"{c[0]} {f}" for c, f, _, _ in FLAGS])
def test_a_number_flag_is_refused_by_its_fields_sentence_naming_the_flag(command, flag, field, bad, capsys):
    """'abc', 1e9, 2.5 and 0, where out of the range CSDConfig accepts, are refused by the real parser in the words
    every box and file field says (csd.numbers), with the flag named: argparse's "invalid float value: 'abc'" is
    gone, and so is the refusal that came only after the command had started."""
    import csd.config
    for value in bad:
        said = parse([*command, flag, value], capsys)
        assert f"error: argument {flag}: {flag} must be " in said, said
        sentence = said.split(f"argument {flag}: ", 1)[1]
        assert sentence.endswith(f'; got "{value}".'), said
        if field is not None:        # the field's own sentence, renamed for the flag
            words = getattr(csd.config, field).named(flag).refusal(f'got "{value}"')
            if flag == "--gamma":
                words = words.replace(" 32;", " 32 or 'auto';")
            assert sentence == words, said


def test_the_flags_read_what_they_accept_as_the_config_takes_it():
    """In range, a flag gives the type CSDConfig validates (an int where it wants one), 'auto' stays 'auto', and
    the edges CSDConfig accepts pass: tau 1, lambda and the temperature 0, lookup 0 and 32."""
    from csd.cli import build_parser
    from csd.config import CSDConfig
    a = build_parser().parse_args([*GENERATE, "--gamma", "4", "--gamma-max", "32", "--tau", "1", "--lam", "0",
                                   "--temperature", "0", "--max-new-tokens", "1,000", "--lookup", "32", "--seed", "0"])
    assert (a.gamma, a.gamma_max, a.tau, a.lam, a.temperature, a.max_new_tokens, a.lookup, a.seed) == \
        (4, 32, 1.0, 0.0, 0.0, 1000, 32, 0)
    assert all(type(v) is int for v in (a.gamma, a.gamma_max, a.max_new_tokens, a.lookup, a.seed))
    CSDConfig.of(gamma=a.gamma, gamma_max=a.gamma_max, tau=a.tau, lam=a.lam, max_new_tokens=a.max_new_tokens,
                 lookup=a.lookup, seed=a.seed).validated()
    d = build_parser().parse_args(GENERATE)
    assert (d.gamma, d.seed, d.lookup, d.tau) == ("auto", None, None, 0.01)
    b = build_parser().parse_args(["bench", "--gamma", "auto", "--seed", "-3", "--limit", "0", "--bound-checks", "0"])
    assert (b.gamma, b.seed, b.limit, b.bound_checks) == ("auto", -3, 0, 0)    # the items' seed: any whole number
    e = build_parser().parse_args(["memory", "export", "t.json", "--format", "sglang", "--tau", "2"])
    assert e.tau == 2.0            # SGLang's prob_ratio: any tau above 0, as export took it


def test_an_open_bound_and_exact_whole_numbers():
    tau = Field("τ", 0, 1, above=True)
    assert tau.words() == "a number above 0 and at most 1" and tau.read("1") == 1.0 and tau.read(1e-300) == 1e-300
    with pytest.raises(NumberError, match="^τ must be a number above 0 and at most 1; got 0.$"):
        tau.read(0)
    assert Field("x", 0, above=True).words() == "a number above 0"
    seed = Field("seed", 0, whole=True)
    assert seed.read("123456789012345678901") == 123456789012345678901       # not through a float
    assert seed.read(2 ** 63 + 1) == 2 ** 63 + 1 and seed.read("1e3") == 1000
