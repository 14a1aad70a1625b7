"""The target on its GGUF file's own blocks (``csd.runtime.kquant``, ``--dtype gguf``): the file's integers read
back exactly, products close to the float weights', and every row of a product computed on its own, so a verify
pass gives each token what a 1-token step gives it and greedy SD writes AR's answer. On the embedded pair's real
files; the rules hold for the vector kernel and for its portable C loops alike."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from csd.runtime import hugepages, kblocks, kquant
from csd.runtime.embedded import assembled
from csd.runtime.ggufile import GGUFFile
from csd.runtime.pair import ModelLoadError


@pytest.fixture(scope="module")
def target_file():
    with assembled("target") as path:
        yield GGUFFile(path)


@pytest.fixture(scope="module")
def draft_file():
    with assembled("draft") as path:
        yield GGUFFile(path)


NAMES = {"Q4_K": "blk.0.ffn_gate.weight", "Q6_K": "blk.0.ffn_down.weight"}   # the embedded target's two types


@pytest.mark.parametrize("kind", sorted(NAMES))
def test_the_files_integers_and_scales_give_back_its_weights(target_file, kind):
    name = NAMES[kind]
    t = target_file.tensors[name]
    assert kblocks.KNOWN[t.qtype] == kind
    raw = np.asarray(target_file.raw(name)[:48])
    unpack, dequantize = {"Q4_K": (kblocks.q4k_unpack, kblocks.q4k_dequantize),
                          "Q6_K": (kblocks.q6k_unpack, kblocks.q6k_dequantize)}[kind]
    ints = unpack(raw)
    # the gguf package's own dequantiser, bit for bit: nothing is rounded a second time
    assert np.array_equal(dequantize(ints), target_file.dequantize(name, slice(0, 48)))


VARIANTS = ["native", "portable", "avx2"]       # the kernel for this CPU, its plain C loops, its AVX2 path


def built(variant: str):
    """The kernel ``variant`` built here; a CPU without AVX2 (or another architecture) cannot build "avx2"."""
    try:
        return kquant.library(variant)
    except kquant.KernelUnavailable as e:
        if variant == "avx2":
            pytest.skip(f"no AVX2 build on this CPU: {e}")
        raise


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", sorted(NAMES))
def test_a_row_is_the_same_alone_or_in_a_pass_of_any_length(target_file, kind, variant):
    name = NAMES[kind]
    t = target_file.tensors[name]
    rows = 64                                   # four tiles of 16 output rows keep the portable loops quick
    part = kquant.KQuantPart(t.qtype, target_file.raw(name)[:rows], t.shape[1])
    built(variant)
    lin = kquant.KQuantLinear([part], variant=variant)
    torch.manual_seed(0)
    x = torch.randn(11, t.shape[1]) * torch.logspace(-2, 2, 11)[:, None]      # rows of very different sizes
    alone = torch.cat([lin(x[i:i + 1]) for i in range(11)])
    for m in (2, 3, 4, 5, 7, 8, 9, 11):         # every chunking of rows the kernel makes
        assert torch.equal(lin(x[:m]), alone[:m]), m
    # threads split output tiles, never a row's sums
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(lin(x), alone)
    finally:
        torch.set_num_threads(threads)
    # and it is the file's matrix, to the precision of int8 activations (as llama.cpp's Q8_K)
    ref = x @ torch.from_numpy(target_file.dequantize(name, slice(0, rows))).T
    err = (alone - ref).norm(dim=1) / ref.norm(dim=1)
    assert float(err.max()) < 0.03


@pytest.mark.parametrize("in_arena", [False, True])
@pytest.mark.parametrize("kind", sorted(NAMES))
def test_a_large_matrix_is_repacked_in_pieces_as_it_would_be_whole(target_file, kind, in_arena, monkeypatch):
    """A matrix of more rows than ``PACK_ROWS`` is repacked a piece at a time (a first start stays within its memory),
    into the very bytes one piece gives, its last tile padded as before: in ordinary memory and in the huge-page
    arena a model's matrices go to (``csd.runtime.hugepages``)."""
    t = target_file.tensors[NAMES[kind]]
    raw = target_file.raw(NAMES[kind])[:600]
    whole = kquant.PACK[t.qtype](np.asarray(raw))
    monkeypatch.setattr(kquant, "PACK_ROWS", 128)
    pieces = kquant.KQuantPart(t.qtype, raw, t.shape[1], hugepages.Arena() if in_arena else None).packed
    assert whole.keys() == pieces.keys() and all(torch.equal(whole[k], pieces[k]) for k in whole)


@pytest.mark.parametrize("kind", ["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K"])
def test_every_build_of_the_kernel_gives_the_same_bits(target_file, draft_file, kind):
    """The AVX-512, AVX2 and plain C loops form the same integer sums and the same floating-point steps, lane for
    lane, so a product's bits do not depend on which of them this CPU runs (passes of 7, 2 and 1 rows, some tiles:
    the AVX2 path takes one or two rows differently from three or four)."""
    if kind in NAMES:
        t = target_file.tensors[NAMES[kind]]
        qtype, raw = t.qtype, np.asarray(target_file.raw(NAMES[kind])[:48])
        cols = t.shape[1]
    else:
        qtype, raw, ref_w = blocks_of_32(draft_file, kind)
        cols = ref_w.shape[1]
    torch.manual_seed(3)
    x = torch.randn(7, cols) * torch.logspace(-2, 2, 7)[:, None]
    outs = {}
    for v in VARIANTS:
        built(v)                                # a CPU that cannot build one skips the comparison, saying why
        lin = kquant.KQuantLinear([kquant.KQuantPart(qtype, raw, cols)], variant=v)
        outs[v] = torch.cat([lin(x), lin(x[:2]), lin(x[:1])])
    assert all(torch.equal(outs["native"], y) for y in outs.values()), {v: float((y - outs["native"]).abs().max())
                                                                        for v, y in outs.items()}


def test_fused_matrices_of_two_types_and_a_bias(target_file):
    """q/k/v fused where v is Q6_K and q, k are Q4_K (layer 0 of the target): one call, each part in its columns."""
    names = [f"blk.0.attn_{p}.weight" for p in "qkv"]
    parts = [kquant.KQuantPart(target_file.tensors[n].qtype, target_file.raw(n), 1536) for n in names]
    assert {kblocks.KNOWN[p.qtype] for p in parts} == {"Q4_K", "Q6_K"}
    bias = torch.from_numpy(np.concatenate([target_file.dequantize(n.replace("weight", "bias")) for n in names]))
    fused = kquant.KQuantLinear(parts, bias)
    x = torch.randn(3, 1536)
    y = fused(x[None])
    assert y.shape == (1, 3, 2048)
    alone = torch.cat([kquant.KQuantLinear([p])(x) for p in parts], 1) + bias
    assert torch.equal(y[0], alone)


def test_what_the_kernel_cannot_read_is_refused_by_name(tmp_path):
    import gguf
    from gguf.quants import quantize
    w = gguf.GGUFWriter(tmp_path / "q4_1.gguf", "qwen2")          # a qwen2 file with a Q4_1 matrix
    w.add_tensor("token_embd.weight", np.zeros((8, 256), np.float32))
    q4_1 = gguf.GGMLQuantizationType.Q4_1
    w.add_tensor("blk.0.attn_q.weight", quantize(np.random.rand(16, 256).astype(np.float32), q4_1), raw_dtype=q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    why = kquant.gguf_refusal(GGUFFile(tmp_path / "q4_1.gguf"))
    assert why is not None and "blk.0.attn_q.weight is Q4_1" in why and "Q4_K" in why
    with pytest.raises(ModelLoadError, match="Q4_1"):
        kquant.lean_from_gguf(tmp_path / "q4_1.gguf")
    with pytest.raises(ValueError, match="Q4_K"):
        kquant.KQuantPart(3, np.zeros((16, 20 * 8), np.uint8), 256)            # ggml type 3 is Q4_1
    with pytest.raises(ValueError, match="256"):
        kquant.KQuantPart(kblocks.Q4_K, np.zeros((16, 144), np.uint8), 200)


DRAFT_NAMES = {"Q5_0": "blk.0.attn_q.weight", "Q8_0": "blk.0.attn_v.weight"}    # the embedded draft's other types


def blocks_of_32(draft_file, kind: str) -> tuple[int, np.ndarray, np.ndarray]:
    """48 rows of a draft matrix as ``kind``'s bytes and gguf's dequantised weights: the file's own Q5_0 and Q8_0,
    or Q4_0 as gguf's quantiser rounds the file's Q5_0 weights (a re-quantised draft)."""
    import gguf
    from gguf.quants import dequantize, quantize
    if kind != "Q4_0":
        t = draft_file.tensors[DRAFT_NAMES[kind]]
        assert kblocks.KNOWN[t.qtype] == kind
        return t.qtype, np.asarray(draft_file.raw(DRAFT_NAMES[kind])[:48]), \
            draft_file.dequantize(DRAFT_NAMES[kind], slice(0, 48))
    q4_0 = gguf.GGMLQuantizationType.Q4_0
    raw = quantize(draft_file.dequantize(DRAFT_NAMES["Q5_0"], slice(0, 48)), q4_0)
    return int(q4_0), raw, dequantize(raw, q4_0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", ["Q4_0", *sorted(DRAFT_NAMES)])
def test_the_drafts_blocks_of_32_read_back_and_keep_rows_apart(draft_file, kind, variant):
    qtype, raw, ref_w = blocks_of_32(draft_file, kind)
    assert np.array_equal(kblocks.b32_dequantize(qtype, kblocks.b32_unpack(qtype, raw)), ref_w)
    built(variant)
    lin = kquant.KQuantLinear([kquant.KQuantPart(qtype, raw, raw.shape[1] // kblocks.B32_BYTES[qtype] * 32)],
                              variant=variant)
    torch.manual_seed(1)
    x = torch.randn(9, ref_w.shape[1]) * torch.logspace(-2, 2, 9)[:, None]
    alone = torch.cat([lin(x[i:i + 1]) for i in range(9)])
    for m in (2, 4, 5, 9):
        assert torch.equal(lin(x[:m]), alone[:m]), m
    ref = x @ torch.from_numpy(ref_w).T
    assert float(((alone - ref).norm(dim=1) / ref.norm(dim=1)).max()) < 0.03


def gpt2_file(path):
    """A GGUF file of an architecture the reader does not know (gpt2), one small tensor in it."""
    import gguf
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((8, 16), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_an_architecture_the_reader_does_not_know_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="gpt2"):
        kquant.lean_from_gguf(gpt2_file(tmp_path / "gpt2.gguf"))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["native", "avx2"])
def test_the_real_target_verifies_a_block_exactly_as_it_steps(target_file, variant, monkeypatch):
    """The whole target (28 layers, the Q6_K output layer): a pass of 7 tokens, and passes of 3 + 4, give each token
    the logits seven 1-token steps give it, bit for bit; so do two sequences' rows in one shared pass. On this
    CPU's kernel, and on its AVX2 path as a CPU without AVX-512 runs it."""
    if kquant.kernel_missing():
        pytest.skip(kquant.kernel_missing())
    monkeypatch.setitem(kquant._libs, "native", built(variant))      # the whole model on that build
    lm = kquant.lean_from_gguf(target_file.path)
    cache = lm.new_cache(256)
    lm.forward(cache, list(range(100, 160)), 1)
    toks = [785, 4226, 315, 9625, 374, 12095, 13]
    whole = lm.forward(cache, toks, 7)
    lm.crop(cache, 60)
    split = torch.cat([lm.forward(cache, toks[:3], 3), lm.forward(cache, toks[3:], 4)])
    lm.crop(cache, 60)
    steps = torch.cat([lm.forward(cache, [t], 1) for t in toks])
    assert torch.equal(whole, steps)
    assert torch.equal(split, steps)
    assert lm._records is not None          # the layers ran in the kernel's kq_layer
    # runs that decode together (a class sharing passes): each sequence's rows as it gets them alone
    lm.crop(cache, 60)
    other = lm.new_cache(256)
    lm.forward(other, list(range(300, 330)), 1)
    together = lm.forward_many([cache, other], [toks[:4], toks[2:4]], [4, 2])
    lm.crop(cache, 60)
    lm.crop(other, 30)
    assert torch.equal(together[0], steps[:4])
    assert torch.equal(together[1], torch.cat([lm.forward(other, [t], 1) for t in toks[2:4]]))


@pytest.mark.slow
def test_a_researchers_own_gguf_pair_runs_from_its_paths(tmp_path):
    """``--draft PATH.gguf --target PATH.gguf`` on the embedded pair's own files handed over as paths, both on their
    own blocks: the target writes the embedded run's answer, greedy SD writes AR's; a file of an unknown architecture
    is refused by name (a pair whose tokenizers differ is refused by ``load_tokenizer``, tests/test_errors.py)."""
    import json
    import subprocess
    import sys

    from csd.runtime.embedded import EMBEDDED, assemble_gguf
    if kquant.kernel_missing():
        pytest.skip(kquant.kernel_missing())
    files = {r: assemble_gguf(EMBEDDED[r], tmp_path / f"{r}.gguf") for r in ("draft", "target")}

    def generate(method: str, *models: str) -> dict:
        r = subprocess.run([sys.executable, "-m", "csd", "generate", "--prompt", "Write a Python function that adds "
                            "two numbers.", "--method", method, "--max-new-tokens", "16", "--dtype", "gguf", "--json",
                            "--no-db", "--draft-dtype", "gguf", *models], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    paths = ("--draft", str(files["draft"]), "--target", str(files["target"]))
    ar, sd = generate("ar", *paths), generate("sd", *paths)
    assert sd["token_ids"] == ar["token_ids"]
    assert generate("ar")["token_ids"] == ar["token_ids"]          # the embedded pair by name: the same answer

    r = subprocess.run([sys.executable, "-m", "csd", "generate", "--prompt", "hi", "--no-db", "--target",
                        str(gpt2_file(tmp_path / "other.gguf")), "--draft", str(files["draft"])],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "gpt2" in r.stderr and "qwen2" in r.stderr


@pytest.mark.slow
def test_a_four_bit_draft_moves_the_guesses_never_the_answer():
    """``--draft-dtype q4_0``: the draft's wider matrices re-rounded to Q4_0 by gguf's quantiser (its Q4_K ones kept
    as the file has them), fewer bytes a step than the file's own blocks; greedy SD still writes the target's own
    answer (AR's), and the draft still proposes tokens the target keeps."""
    from csd.config import CSDConfig
    from csd.decode import Decoder
    from csd.runtime.models import load_pair
    if kquant.kernel_missing():
        pytest.skip(kquant.kernel_missing())
    pair = load_pair(dtype="gguf", draft_weights="q4_0")
    assert pair.rep.draft == "q4_0" and pair.rep.target == "gguf"

    def matrices(lm):
        return [m for layer in lm.layers for m in layer if isinstance(m, kquant.KQuantLinear)] + [lm.head]
    assert {p.qtype for m in matrices(pair.draft_lm) for p in m.parts} <= set(kquant.FOUR_BIT)
    own = load_pair(dtype="gguf", draft_weights="gguf", draft_alone=True).lm
    assert sum(m.nbytes() for m in matrices(pair.draft_lm)) < 0.8 * sum(m.nbytes() for m in matrices(own))
    ids = pair.encode_prompt("Write a Python function that returns the largest of three numbers.")
    ar, sd = (Decoder(pair).run(ids, CSDConfig(method=m, gamma=6, lookup=0, max_new_tokens=48)) for m in ("ar", "sd"))
    list(ar)
    list(sd)
    assert sd.token_ids == ar.token_ids
    assert sd.metrics.accepted > 0.5 * len(sd.token_ids)        # its guesses are still mostly the target's


def test_a_four_bit_draft_is_rounded_once_and_kept_by_its_bytes(draft_file, tmp_path, monkeypatch):
    """``--draft-dtype q4_0`` rounds the draft's matrices once into the cache (``FourBitStore``); a later load reads
    them back, and an entry whose digest no longer matches its file bytes is rounded again, never misread."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
    monkeypatch.setenv("CSD_CACHE_DIR", str(tmp_path))
    vocab = torch.arange(512)

    def packed(lm) -> list[torch.Tensor]:
        mods = [m for layer in lm.layers for m in layer if isinstance(m, kquant.KQuantLinear)] + [lm.head]
        return [t for m in mods for p in m.parts for t in p.packed.values()]

    first = packed(kquant.lean_from_gguf(draft_file.path, vocab, four_bit=True))
    [store] = (tmp_path / "q4_0").glob("*.safetensors")
    name = "blk.0.attn_q.weight"
    with safe_open(str(store), framework="np") as sf:
        digests = sf.metadata()
    entries = load_file(str(store))
    assert name in entries and digests[name]
    entries[name] = np.zeros_like(entries[name])                   # other bytes under the same digest: read back
    save_file(entries, str(store), metadata=digests)
    assert any(not torch.equal(a, b) for a, b in zip(first, packed(kquant.lean_from_gguf(draft_file.path, vocab,
                                                                                         four_bit=True))))
    save_file(entries, str(store), metadata={**digests, name: "another file's bytes"})     # rounded again
    assert all(torch.equal(a, b) for a, b in zip(first, packed(kquant.lean_from_gguf(draft_file.path, vocab,
                                                                                     four_bit=True))))


# (heads, KV heads, head size, cache capacity, cached tokens, new tokens): the embedded target's and draft's heads
# in a verify pass, a prompt's pass of several blocks of rows over several spans of keys (kquant.c's KQ_QROWS and
# KQ_SPAN), and a head size of no whole 16 floats
ATTENTION_SHAPES = [(12, 2, 128, 64, 40, 7), (14, 2, 64, 200, 150, 20), (6, 2, 24, 40, 17, 9)]


def attend_with(lib, q, k, v, start, threads):
    """``kq_attend`` of the queries q (H, T, D) at positions start .. over the cache k, v (KV, cap, D)."""
    heads, t, d = q.shape
    out = torch.empty(t, heads, d)
    held = q.contiguous()                   # held while the kernel reads it
    lib.kq_attend(held.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), heads, k.shape[0], t, d, k.shape[1],
                  start, d ** -0.5, threads)
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", ATTENTION_SHAPES)
def test_the_attention_takes_each_query_as_a_step_would(variant, shape):
    """``kq_attend``: the queries of a pass attend as 1-token steps do, bit for bit, whatever the number of threads,
    and as PyTorch's attention does to float precision (grouped heads, a causal block after cached keys), in every
    build of the kernel."""
    import torch.nn.functional as F
    lib = built(variant)
    torch.manual_seed(0)
    heads, kv, d, cap, start, t = shape
    k, v = torch.randn(kv, cap, d), torch.randn(kv, cap, d)
    q = torch.randn(heads, t, d)
    whole = attend_with(lib, q, k, v, start, torch.get_num_threads())
    steps = torch.cat([attend_with(lib, q[:, i:i + 1], k, v, start + i, 1) for i in range(t)])
    assert torch.equal(whole, steps)
    for threads in (1, 3, 16):              # jobs cut and shared out otherwise
        assert torch.equal(attend_with(lib, q, k, v, start, threads), whole)
    mask = torch.ones(t, start + t, dtype=torch.bool).tril(start)
    ref = F.scaled_dot_product_attention(q[None], k[None, :, :start + t], v[None, :, :start + t], attn_mask=mask,
                                         scale=d ** -0.5, enable_gqa=True)
    assert torch.allclose(whole, ref[0].transpose(0, 1), atol=1e-5)


@pytest.mark.parametrize("shape", ATTENTION_SHAPES)
def test_the_attention_gives_the_same_bits_in_every_build(shape):
    """``kq_attend`` adds each query's 16 running dot-product sums in one fixed order, and computes its softmax's
    exp itself, so the AVX-512 build, the AVX2 build and the plain C loops give the same bits (an attention left to
    each instruction set's own reduction did not: the AVX2 build's answers left the AVX-512 build's on 3 of 8
    benchmark items)."""
    torch.manual_seed(1)
    heads, kv, d, cap, start, t = shape
    k, v, q = torch.randn(kv, cap, d), torch.randn(kv, cap, d), 4 * torch.randn(heads, t, d)
    outs = {variant: attend_with(built(variant), q, k, v, start, torch.get_num_threads()) for variant in VARIANTS}
    assert all(torch.equal(outs["native"], o) for o in outs.values()), {v: (o - outs["native"]).abs().max()
                                                                        for v, o in outs.items()}


def test_the_kernels_exp_is_within_two_ulp_and_the_same_in_every_build():
    """The softmax's own exp (``kq_exp``), over all it is given (scores less their largest, so at most 0): within
    2 units in the last place of the exact value down to -87, 0 below it and for a NaN, the same bits in every
    build."""
    x = torch.cat([torch.linspace(-87, 0, 1_000_003), torch.tensor([0.0, -0.0, -1e-30, -87.0, -87.01, -100.0,
                                                                    -float("inf"), float("nan")])])
    outs = {}
    for variant in VARIANTS:
        y, kq_exp = torch.empty_like(x), built(variant).kq_exp
        kq_exp.argtypes, kq_exp.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
        kq_exp(x.data_ptr(), y.data_ptr(), x.numel())
        outs[variant] = y
    y = outs["native"]
    assert all(torch.equal(y, o) for o in outs.values())
    live = x >= -87
    exact = x[live].double().exp()
    ulp = torch.from_numpy(np.spacing(exact.float().numpy())).double()
    assert ((y[live].double() - exact).abs() / ulp).max() <= 2
    assert (y[~live] == 0).all()


@pytest.mark.slow
def test_the_whole_draft_gives_the_same_logits_in_every_build(draft_file, monkeypatch):
    """The embedded draft on its GGUF blocks, every step in the kernel (its layers, its last norm, its output layer):
    the same logits, bit for bit, on the AVX-512 build, the AVX2 build and the plain C loops, so a CPU with AVX-512
    and one without write the same greedy answers."""
    logits = {}
    for variant in VARIANTS:
        monkeypatch.setitem(kquant._libs, "native", built(variant))       # the whole model on that build
        lm = kquant.lean_from_gguf(draft_file.path)
        cache = lm.new_cache(64)
        lm.forward(cache, [9707, 11, 1879, 374, 264, 1273], 1)
        logits[variant] = lm.forward(cache, [3405, 25], 2)
    assert all(torch.equal(logits["native"], x) for x in logits.values()), {
        v: (x - logits["native"]).abs().max().item() for v, x in logits.items()}


def test_auto_follows_prepares_timing_and_a_missing_kernel_falls_back(tmp_path, monkeypatch, qwen_tokenizer, caplog):
    """``--dtype auto`` on the CPU reads prepare's record (gguf where it measured it faster), int8 where the kernel
    cannot run; ``--dtype gguf`` on a model that is no GGUF file loads the int8 target, with one warning saying so."""
    from conftest import tiny_model
    from csd.fileio import write_json
    from csd.runtime import profile
    from csd.runtime.models import LoadOptions, load_pair
    monkeypatch.setenv("CSD_CACHE_DIR", str(tmp_path / "cache"))
    assert LoadOptions().validated().dtype == "int8"                    # nothing measured
    write_json(profile.target_choice_file(), {"choice": "gguf"})
    if kquant.kernel_missing() is None:
        assert LoadOptions().validated().dtype == "gguf"
    monkeypatch.setattr(kquant, "kernel_missing", lambda: "no C compiler here")
    assert LoadOptions().validated().dtype == "int8"
    monkeypatch.undo()
    monkeypatch.setenv("CSD_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "tiny"
    tiny_model(2).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    with caplog.at_level("WARNING"):
        pair = load_pair(None, str(d), dtype="gguf")
    assert pair.rep.target == "int8" and pair.rep.activations == "row"
    warned = [r.getMessage() for r in caplog.records if "GGUF blocks" in r.getMessage()]
    assert len(warned) == 1 and "int8" in warned[0] and "not a GGUF file" in warned[0]


def test_a_target_timed_on_its_blocks_is_handed_to_the_next_load_once():
    """A first start times the target on its GGUF blocks, then loads it for the app: the timed one is taken (the
    file's blocks read once), by the next load of that target on its blocks, once."""
    from csd.runtime import models

    class Timed:        # stands for the timed target's LM: what the load hands on, it does not read
        device = torch.device("cpu")
        impl = "kquant"

    timed = Timed()
    models.keep_target_lm("embedded", timed)
    try:
        pair = models.load_pair(None, "embedded", dtype="gguf")
        assert pair.target_lm is timed and pair.rep.target == "gguf"
        assert models._kept_targets == {}          # taken once: a later load reads the file again
    finally:
        models._kept_targets.clear()


def test_the_environment_picks_the_kernels_build_and_the_profiles_follow(monkeypatch):
    """``CSD_KQUANT_VARIANT`` runs the models on another build (the AVX2 path on an AVX-512 CPU, to measure it);
    a name that is no build is refused by name, and the engine's digest, which keys every cached profile and
    prepare's choices, tells the builds apart."""
    from csd.runtime import profile
    native = profile.engine_revision.__wrapped__()
    monkeypatch.setenv(kquant.VARIANT_ENV, "portable")
    assert kquant.library() is kquant.library("portable") and kquant.library().kq_simd() == 0
    assert profile.engine_revision.__wrapped__() != native
    monkeypatch.setenv(kquant.VARIANT_ENV, "avx512")
    with pytest.raises(kquant.KernelUnavailable, match="CSD_KQUANT_VARIANT='avx512' names no build.*native, portable"):
        kquant.library()
    assert "names no build" in kquant.kernel_missing()      # so --dtype auto runs the target in int8, and says why
    monkeypatch.delenv(kquant.VARIANT_ENV)
    assert profile.engine_revision.__wrapped__() == native and kquant.library() is kquant.library("native")
