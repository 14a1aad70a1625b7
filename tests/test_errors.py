"""Bad input gets a clear error: out-of-range parameters, unknown models, mismatched tokenizers,
memory files that are not memories or belong to another pair, empty or too long prompts."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, tiny_model
from csd.config import ConfigError, CSDConfig
from csd.memory import CorrectionMemory, MemoryFileError
from csd.runtime.models import compare_tokenizers, load_pair
from csd.runtime.pair import ModelLoadError


@pytest.mark.parametrize("field,value,needle", [
    ("gamma", 0, "gamma must be an integer in 1..32"),
    ("gamma", 33, "gamma must be an integer in 1..32"),
    ("gamma", 2.5, "gamma must be an integer"),
    ("lam", -1, "lambda must be a count >= 0"),
    ("tau", 0, "tau must be in (0, 1]"),
    ("tau", 1.5, "tau must be in (0, 1]"),
    ("tau", float("nan"), "tau must be in (0, 1]"),
    ("temperature", -0.1, "temperature must be >= 0"),
    ("max_new_tokens", 0, "max_new_tokens must be an integer >= 1"),
    ("method", "fast", "unknown method 'fast'"),
])
def test_out_of_range_config_is_refused(field, value, needle):
    with pytest.raises(ConfigError, match=None) as e:
        CSDConfig(**{field: value}).validated()
    assert needle in str(e.value)


def test_defaults_are_the_papers_and_valid():
    c = CSDConfig().validated()
    assert (c.gamma, c.lam, c.tau, c.method) == (6, 6, 0.01, "csd")


def test_context_overflow_is_refused():
    with pytest.raises(ConfigError, match="exceeds the model's context of 256 tokens"):
        CSDConfig(max_new_tokens=200).validated(context_limit=256, prompt_tokens=100)


def test_decoder_refuses_overlong_prompt_and_foreign_memory(tiny_pair):
    from csd.decode import Decoder
    dec = Decoder(tiny_pair)
    with pytest.raises(ConfigError, match="exceeds the model's context"):
        dec.run([1] * 250, CSDConfig(max_new_tokens=10))
    with pytest.raises(ValueError, match="the prompt is empty"):
        dec.run([], CSDConfig(max_new_tokens=10))
    with pytest.raises(ValueError, match="belongs to 'other-pair'"):
        dec.run([1, 2], CSDConfig(max_new_tokens=10), CorrectionMemory("other-pair"))


def test_memory_files(tmp_path):
    mem = CorrectionMemory("a->b", {(1, 2): 7, (3, 4): 1})
    for name in ("m.json", "m.json.gz"):
        mem.save(tmp_path / name)
        back = CorrectionMemory.load(tmp_path / name, expected_pair="a->b")
        assert back.count(1, 2) == 7 and back.count(3, 4) == 1 and back.count(2, 1) == 0
    with pytest.raises(MemoryFileError, match="belongs to model pair 'a->b', not to 'c->d'"):
        CorrectionMemory.load(tmp_path / "m.json", expected_pair="c->d")
    (tmp_path / "x.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(MemoryFileError, match="not a CSD Explorer correction-memory file"):
        CorrectionMemory.load(tmp_path / "x.json")
    (tmp_path / "y.bin").write_bytes(b"\x00\x01garbage")
    with pytest.raises(MemoryFileError, match="not JSON"):
        CorrectionMemory.load(tmp_path / "y.bin")
    with pytest.raises(MemoryFileError, match="cannot read memory file"):
        CorrectionMemory.load(tmp_path / "missing.json")
    whole = (tmp_path / "m.json.gz").read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(whole[: len(whole) // 2])      # a copy cut off half way
    with pytest.raises(MemoryFileError, match="damaged or truncated gzip"):
        CorrectionMemory.load(tmp_path / "cut.json.gz")


def test_json_data_files_gzip_by_name_and_read_by_content(tmp_path):
    from csd.fileio import read_json, write_json

    obj = {"ids": list(range(50)), "counts": [3] * 50}
    write_json(tmp_path / "a.json.gz", obj)
    write_json(tmp_path / "a.json", obj)
    assert (tmp_path / "a.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert json.loads((tmp_path / "a.json").read_text()) == obj
    assert read_json(tmp_path / "a.json.gz") == obj == read_json(tmp_path / "a.json")
    write_json(tmp_path / "b.json.gz", obj)                              # reproducible: no time stamp inside
    assert (tmp_path / "b.json.gz").read_bytes() == (tmp_path / "a.json.gz").read_bytes()
    (tmp_path / "plain.json.gz").write_text(json.dumps(obj))              # a plain file under a .gz name
    assert read_json(tmp_path / "plain.json.gz") == obj
    assert not list(tmp_path.glob(".*.tmp"))                             # atomic writes leave no temporary


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="cannot load target model 'no-such-org/no-such-model-either': not a local "
                                             "directory and not in the hub cache, and HF_HUB_OFFLINE is set"):
        load_pair("no-such-org/no-such-model", "no-such-org/no-such-model-either")


def test_mismatched_tokenizers_are_refused(tmp_path, qwen_tokenizer):
    """Two real model directories whose tokenizers differ by one added token."""
    a, b = tmp_path / "draft", tmp_path / "target"
    tiny_model(1).save_pretrained(a)
    qwen_tokenizer.save_pretrained(a)
    tiny_model(2).save_pretrained(b)
    tok_b = type(qwen_tokenizer).from_pretrained(a)
    tok_b.add_tokens(["<csd-extra-token>"])
    tok_b.save_pretrained(b)
    assert "vocabulary sizes differ" in compare_tokenizers(qwen_tokenizer, tok_b)
    with pytest.raises(ModelLoadError, match="do not share a tokenizer: vocabulary sizes differ"):
        load_pair(str(a), str(b), dtype="float32")
    # the same directory twice is accepted
    pair = load_pair(str(a), str(a), dtype="float32")
    assert pair.draft_lm is not None and pair.pair_id == "draft->draft"


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "csd", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["generate", "--prompt", "   "], "error: the prompt is empty"),
    # a number flag: refused by the parser in csd.numbers' words, the flag named (tests/test_numbers.py: every one)
    (["generate", "--prompt", "hi", "--gamma", "0"],
     "error: argument --gamma: --gamma must be a whole number from 1 to 32 or 'auto'; got \"0\"."),
    (["generate", "--prompt", "hi", "--lam", "-2"], "error: argument --lam: --lam must be a number, 0 or more"),
    (["generate", "--prompt", "hi", "--tau", "0"],
     "error: argument --tau: --tau must be a number above 0 and at most 1; got \"0\"."),
    (["generate", "--prompt", "hi", "--temperature", "-1"],
     "error: argument --temperature: --temperature must be a number, 0 or more"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"],
     "error: argument --max-new-tokens: --max-new-tokens must be a whole number, 1 or more"),
    (["generate", "--prompt", "hi", "--lookup", "-1"],
     "error: argument --lookup: --lookup must be a whole number from 0 to 32 (0 turns it off)"),
    (["generate", "--prompt", "hi", "--lookup", "8", "--method", "ar"], "use them with sd, csd or an ablation, not ar"),
    (["generate", "--prompt", "hi", "--lookup", "8", "--lookup-ngram", "0"],
     "error: argument --lookup-ngram: --lookup-ngram must be a whole number from 1 to 4"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "40000", "--no-db"], "exceeds the model's context of 32768"),
    (["generate", "--prompt", "hi", "--no-db", "--draft", "nobody/none", "--target", "nobody/none"],
     "error: cannot load target model 'nobody/none': not a local directory and not in the hub cache"),
    # a store that cannot be opened is named before any model loads (bench opened it after, minutes in)
    (["generate", "--prompt", "hi", "--db", "bogus://x"], "error: cannot open the database bogus://x"),
    (["bench", "--limit", "1", "--db", "bogus://x"], "error: cannot open the database bogus://x"),
    (["runs", "list", "--db", "bogus://x"], "error: cannot open the database bogus://x"),
    (["runs", "list", "--limit", "0", "--db", "sqlite://"], "error: --limit must be at least 1"),
    (["runs", "list", "--db", "none"], "error: 'none' is no database"),
    # so is a memory file that cannot be read (it was read after the load)
    (["generate", "--prompt", "hi", "--no-db", "--memory", "/nonexistent.json"], "error: cannot read memory file"),
    (["calibrate", "--no-db", "--out", "/tmp/never.json", "--memory", "/nonexistent.json"],
     "error: cannot read memory file"),
    (["bench", "--limit", "1", "--no-db", "--memory", "/nonexistent.json"], "error: cannot read memory file"),
])
def test_cli_errors(args, needle):
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_an_out_of_memory_load_names_the_model_the_representation_and_the_need(monkeypatch):
    """An out-of-memory while loading (injected: a real one would end this machine's process) becomes
    a ModelLoadError naming the model, its representation and what its weights need, from its config."""
    import torch
    import transformers

    from csd.runtime.embedded import prepare_embedded
    from csd.runtime.models import load_pair, out_of_memory
    from csd.runtime.pair import ModelLoadError

    msg = out_of_memory("target", "embedded", prepare_embedded("target"), torch.bfloat16, torch.device("cpu"))
    assert msg.startswith("out of memory loading the target model 'embedded' in bfloat16 on cpu")
    need = float(msg.split("need about ")[1].split(" GiB")[0])
    # the embedded 1.5B target (its own output layer): 1.78e9 parameters, 2 bytes each
    assert 3.1 < need < 3.5

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", oom)
    with pytest.raises(ModelLoadError, match=r"out of memory loading the target model .* in float32 .*need about"):
        load_pair(None, dtype="float32", device="cpu")
