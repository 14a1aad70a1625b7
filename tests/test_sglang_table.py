"""SGLang's CSD table both ways (csd.calibration.sglang_table, ``python -m csd memory export|import``): round trips,
a hand-written JSONL as SGLang reads it, and every bad input refused with nothing written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from csd.calibration.sglang_table import (
    EMBEDDED_VOCAB,
    TableError,
    Vocabulary,
    disallowed,
    export_memory,
    import_table,
    load_memory_or_table,
    pack,
    parse_table,
    read_table,
)
from csd.cli import main
from csd.memory import DEFAULT_MEMORY_FILE, CorrectionMemory, MemoryFileError
from csd.runtime.pair import EMBEDDED_PAIR_ID

ROOT = Path(__file__).resolve().parents[1]

# As an SGLang user would write it: a metadata line (SGLang reads the nested object), entries by
# lhs/rhs, one by key (lhs 220 << 32 | rhs 13), one with allow false, one without freq (SGLang: 1).
HAND_JSONL = "\n".join([
    '{"type": "metadata", "metadata": {"tokenizer": "Qwen/Qwen2.5-Coder-1.5B-Instruct", "backend": "standalone"}}',
    '{"lhs_token": 279, "rhs_token": 264, "freq": 12, "allow": true}',
    '',
    f'{{"key": {220 << 32 | 13}, "freq": 7}}',
    '{"lhs_token": 11, "rhs_token": 13, "freq": 9, "allow": false}',
    '{"lhs_token": 1, "rhs_token": 2}',
]) + "\n"


def entries(path: Path) -> list[dict]:
    """The entries of a written table, either form, without the metadata."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [r for r in rows if r.get("type") != "metadata"]
    return json.loads(text)["entries"]


def metadata(path: Path) -> dict:
    text = path.read_text()
    if path.suffix == ".jsonl":
        first = json.loads(text.splitlines()[0])
        assert first["type"] == "metadata"
        return first["metadata"]
    return json.loads(text)["metadata"]


def nothing_written(d: Path, keep: set[str]) -> None:
    """No output and no temporary file beside it."""
    assert {p.name for p in d.iterdir()} == keep


# -- round trips ----------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_export_import_export_gives_the_same_entries(tmp_path, suffix):
    shipped = CorrectionMemory.load(DEFAULT_MEMORY_FILE)
    first = export_memory(shipped, tmp_path / f"a{suffix}", EMBEDDED_VOCAB, 6)
    back = import_table(first, shipped.pair_id, EMBEDDED_VOCAB)
    assert dict(back.items()) == dict(shipped.items()) and back.pair_id == shipped.pair_id
    second = export_memory(back, tmp_path / f"b{suffix}", EMBEDDED_VOCAB, 6)
    assert entries(first) == entries(second)
    rows = entries(first)
    assert len(rows) == len(shipped) == 15_064 and sum(r["freq"] for r in rows) == shipped.total
    r = rows[0]
    assert r["key"] == pack(r["lhs_token"], r["rhs_token"]) and r["allow"] is True
    md = metadata(first)
    assert md["pair"] == EMBEDDED_PAIR_ID and md["tokenizer"] == EMBEDDED_VOCAB.tokenizer
    assert md["freq_threshold"] == 6 and md["lambda"] == 6 and md["vocab_size"] == 151_936


def test_a_hand_written_sglang_jsonl_imports_and_exports_back(tmp_path):
    src = tmp_path / "server.jsonl"
    src.write_text(HAND_JSONL)
    mem = import_table(src, EMBEDDED_PAIR_ID, EMBEDDED_VOCAB)
    assert dict(mem.items()) == {(279, 264): 12, (220, 13): 7, (11, 13): 9, (1, 2): 1}
    assert disallowed(mem) == {(11, 13)}                           # kept, with its count, and marked
    assert mem.meta["sglang"]["metadata"]["backend"] == "standalone"
    saved = mem.save(tmp_path / "m.json.gz")                        # what generate --memory and the app read
    again = CorrectionMemory.load(saved, expected_pair=EMBEDDED_PAIR_ID)
    out = export_memory(again, tmp_path / "back.jsonl", EMBEDDED_VOCAB, 6, tau=0.01)
    got = {(r["lhs_token"], r["rhs_token"]): (r["freq"], r["allow"]) for r in entries(out)}
    assert got == {(279, 264): (12, True), (220, 13): (7, True), (11, 13): (9, False), (1, 2): (1, True)}
    md = metadata(out)
    assert md["backend"] == "standalone" and md["prob_ratio"] == 0.01 and md["freq_threshold"] == 6


def test_the_json_forms_sglang_reads(tmp_path):
    # a bare list; an object with metadata and entries; a delta file as SGLang 97c80bb saves it
    listed = parse_table(json.dumps([{"lhs_token": 5, "rhs_token": 6, "freq": 3}]), jsonl=False)
    assert listed.freq == {(5, 6): 3} and listed.metadata == {}
    delta = {"metadata": {"content": "raw_delta_counts"},
             "entries": [{"key": pack(5, 6), "lhs_token": 5, "rhs_token": 6, "freq": 4, "allow": False}]}
    (tmp_path / "delta.json").write_text(json.dumps(delta))
    mem = import_table(tmp_path / "delta.json", "tiny", Vocabulary("tiny-tok", 32))
    assert mem.count(5, 6) == 4 and disallowed(mem) == {(5, 6)}
    packed = json.dumps({"key": pack(5, 6), "freq": 3})
    repeated = parse_table('{"lhs_token": 5, "rhs_token": 6, "freq": 2}\n' + packed, True)
    assert repeated.freq == {(5, 6): 5} and repeated.duplicates == 1     # shards merged: counts summed


def test_the_app_loader_tells_a_table_from_a_memory(tmp_path):
    mem = CorrectionMemory(EMBEDDED_PAIR_ID, {(3, 4): 2})
    mem.save(tmp_path / "m.json")
    export_memory(mem, tmp_path / "t.json", EMBEDDED_VOCAB, 6)
    assert load_memory_or_table(tmp_path / "m.json", EMBEDDED_PAIR_ID, EMBEDDED_VOCAB).meta == {}
    assert "sglang" in load_memory_or_table(tmp_path / "t.json", EMBEDDED_PAIR_ID, EMBEDDED_VOCAB).meta
    (tmp_path / "list.json").write_text("[1, 2, 3]")                # neither: the memory loader's sentence
    with pytest.raises(MemoryFileError, match="not a CSD Explorer correction-memory file"):
        load_memory_or_table(tmp_path / "list.json", EMBEDDED_PAIR_ID, EMBEDDED_VOCAB)
    (tmp_path / "cut.json").write_text('[{"lhs_token": 1,\n')            # malformed JSON: the table reader's line
    with pytest.raises(TableError, match="line 2: malformed JSON"):
        load_memory_or_table(tmp_path / "cut.json", EMBEDDED_PAIR_ID, EMBEDDED_VOCAB)


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, jsonl, message", [
    ('{"type": "metadata", "metadata": {}}\n{"lhs_token": 151936, "rhs_token": 1}\n', True,
     "line 2: token id 151936 (lhs_token) is beyond the vocabulary of Qwen/Qwen2.5-Coder-1.5B-Instruct: 151,936 ids"),
    (json.dumps({"key": pack(3, 200_000)}), True, "line 1: token id 200000 (rhs_token (from key)) is beyond"),
    ('{"lhs_token": 1, "rhs_token": 2}\n\n{"lhs_token": 1, "rhs_token": \n', True, "line 3: malformed JSON"),
    ('{"metadata": {},\n "entries": [\n {"lhs_token": 1, "rhs_token": 2},\n {"lhs_token": 1 "rhs_token": 2}\n]}',
     False, "line 4: malformed JSON"),
    (json.dumps({"key": pack(1, 2), "lhs_token": 9, "rhs_token": 9}), True, "line 1: key 4294967298 is lhs 1, rhs 2"),
    ('{"key": -1}\n', True, "line 1: key -1 is negative"),
    ('{"lhs_token": 1, "rhs_token": 2, "allow": "false"}\n', True, "line 1: allow must be true or false"),
    ('{"lhs_token": 1, "rhs_token": 2, "freq": 2.5}\n', True, "line 1: freq must be a whole number"),
    ('{"lhs_token": 1}\n', True, "line 1: an entry needs lhs_token and rhs_token, or key"),
    ('{"hello": 1}', False, "not an SGLang CSD table"),
])
def test_bad_tables_are_refused_with_the_line(text, jsonl, message):
    with pytest.raises(TableError) as e:
        parse_table(text, jsonl, EMBEDDED_VOCAB)
    assert message in str(e.value)


def test_another_tokenizer_is_refused_unless_forced(tmp_path):
    src = tmp_path / "llama.jsonl"
    src.write_text('{"type": "metadata", "metadata": {"tokenizer": "meta-llama/Llama-3.2-1B"}}\n'
                   '{"lhs_token": 1, "rhs_token": 2, "freq": 6}\n')
    with pytest.raises(TableError, match="names tokenizer 'meta-llama/Llama-3.2-1B', not 'Qwen/Qwen2.5-Coder"):
        import_table(src, EMBEDDED_PAIR_ID, EMBEDDED_VOCAB)
    assert import_table(src, EMBEDDED_PAIR_ID, EMBEDDED_VOCAB, force=True).count(1, 2) == 6
    # the same tokenizer under a server's local path is the same tokenizer
    src.write_text('{"type": "metadata", "metadata": {"tokenizer": "/data/model/Qwen2.5-Coder-1.5B-Instruct"}}\n'
                   '{"lhs_token": 1, "rhs_token": 2, "freq": 4}\n')
    assert import_table(src, EMBEDDED_PAIR_ID, EMBEDDED_VOCAB).count(1, 2) == 4


EMPTY = {"empty.jsonl": ("", "empty.jsonl is empty"), "blank.jsonl": ("\n  \n\t\n", "blank.jsonl is empty"),
         "empty.json": ("", "empty.json is empty"), "blank.json": ("\n\n", "blank.json is empty"),
         "none.json": ('{"metadata": {}, "entries": []}', "none.json holds no entries"),
         "list.json": ("[]", "list.json holds no entries"),
         "meta.jsonl": ('{"type": "metadata", "metadata": {}}\n', "meta.jsonl holds no entries"),
         "empty.json.gz": ("", "empty.json.gz is empty")}


def test_empty_and_blank_files_are_refused_naming_the_file(tmp_path, capsys):
    """An empty table would replace a memory of thousands of patterns with none: refused like a malformed one,
    by the app's loader and by the command line, which writes nothing."""
    old = tmp_path / "m.json.gz"
    CorrectionMemory(EMBEDDED_PAIR_ID, {(3, 4): 2}).save(old)
    before = old.read_bytes()
    for name, (text, message) in EMPTY.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(MemoryFileError) as e:
            load_memory_or_table(tmp_path / name, EMBEDDED_PAIR_ID, EMBEDDED_VOCAB)
        assert message in str(e.value), name
        assert main(["memory", "import", str(tmp_path / name), "--out", str(old)]) == 2
        assert message in capsys.readouterr().err, name
        assert old.read_bytes() == before, name
    (tmp_path / "blank.mem").write_text(" \n")                       # neither named a table nor JSON: a memory's
    with pytest.raises(MemoryFileError, match="blank.mem is empty: not a CSD Explorer correction-memory file"):
        load_memory_or_table(tmp_path / "blank.mem", EMBEDDED_PAIR_ID, EMBEDDED_VOCAB)


def test_the_command_line_refuses_bad_input_and_writes_nothing(tmp_path, capsys):
    cases = {
        "big.jsonl": ('{"lhs_token": 5, "rhs_token": 999999}\n', "token id 999999 (rhs_token) is beyond the "
                      "vocabulary of Qwen/Qwen2.5-Coder-1.5B-Instruct: 151,936 ids"),
        "bad.json": ('{"entries": [\n{"lhs_token": 5,, "rhs_token": 6}]}', "line 2: malformed JSON"),
        "other.jsonl": ('{"type": "metadata", "metadata": {"tokenizer": "gpt2"}}\n{"lhs_token": 5, "rhs_token": 6}\n',
                        "names tokenizer 'gpt2'"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        assert main(["memory", "import", str(tmp_path / name), "--out", str(tmp_path / "m.json.gz")]) == 2
        assert message in capsys.readouterr().err, name
        nothing_written(tmp_path, set(cases) & {p.name for p in tmp_path.iterdir()})
    assert main(["memory", "import", str(tmp_path / "other.jsonl"), "--out", str(tmp_path / "m.json.gz"),
                 "--force"]) == 0
    old = (tmp_path / "m.json.gz").read_bytes()
    assert main(["memory", "import", str(tmp_path / "big.jsonl"), "--out", str(tmp_path / "m.json.gz")]) == 2
    assert (tmp_path / "m.json.gz").read_bytes() == old          # a refused import leaves the old file whole
    # an export that cannot be written in full leaves nothing: an id beyond the given vocabulary
    CorrectionMemory("a->b", {(40, 2): 3}).save(tmp_path / "ab.json")
    assert main(["memory", "export", "--format", "sglang", str(tmp_path / "ab.jsonl"), "--memory",
                 str(tmp_path / "ab.json"), "--tokenizer", "tiny", "--vocab-size", "32"]) == 2
    assert "token id 40 (draft) is beyond the vocabulary of tiny: 32 ids" in capsys.readouterr().err
    assert main(["memory", "export", "--format", "sglang", str(tmp_path / "ab.txt"), "--memory",
                 str(tmp_path / "ab.json"), "--tokenizer", "tiny", "--vocab-size", "64"]) == 2
    assert "named .json or .jsonl" in capsys.readouterr().err
    assert main(["memory", "export", "--format", "sglang", str(tmp_path / "ab.jsonl"), "--memory",
                 str(tmp_path / "ab.json")]) == 2
    assert "give --tokenizer and --vocab-size" in capsys.readouterr().err
    nothing_written(tmp_path, set(cases) | {"m.json.gz", "ab.json"})


def test_the_command_line_round_trip_in_process(tmp_path, capsys):
    src = tmp_path / "server.jsonl"
    src.write_text(HAND_JSONL)
    assert main(["memory", "import", str(src), "--out", str(tmp_path / "m.json.gz")]) == 0
    assert "4 patterns, 29 counted divergences" in capsys.readouterr().err
    assert main(["memory", "export", "--format", "sglang", str(tmp_path / "t.json"),
                 "--memory", str(tmp_path / "m.json.gz"), "--lam", "5.5"]) == 0
    assert "--speculative-csd-freq-threshold 6" in capsys.readouterr().err
    rows = entries(tmp_path / "t.json")
    assert {(r["lhs_token"], r["rhs_token"]): r["freq"] for r in rows} == {(279, 264): 12, (220, 13): 7,
                                                                           (11, 13): 9, (1, 2): 1}
    assert metadata(tmp_path / "t.json")["freq_threshold"] == 5.5


@pytest.mark.slow
def test_the_command_line_in_a_subprocess(tmp_path):
    """``python -m csd memory export`` of the shipped memory, imported back, exported again: the same entries."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "csd", "memory", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
    first = run("export", "--format", "sglang", str(tmp_path / "a.jsonl"))
    assert first.returncode == 0, first.stderr
    assert "15,064 entries" in first.stderr
    back = run("import", str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "m.json.gz"))
    assert back.returncode == 0, back.stderr
    again = run("export", "--format", "sglang", str(tmp_path / "b.jsonl"), "--memory", str(tmp_path / "m.json.gz"))
    assert again.returncode == 0, again.stderr
    assert entries(tmp_path / "a.jsonl") == entries(tmp_path / "b.jsonl")
    assert read_table(tmp_path / "b.jsonl").metadata["tokenizer"] == EMBEDDED_VOCAB.tokenizer
