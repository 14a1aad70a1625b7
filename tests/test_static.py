"""The static decode path (``csd.runtime.static``): a fixed-capacity KV cache, positions on the device,
attention over the masked capacity, and (on CUDA) one captured graph per pass shape. On the CPU it
runs the same fixed-shape function eagerly, so the function, the rollbacks and the refusals are
tested here; the graphs where a CUDA device is present."""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import make_pair, perturbed, tiny_model
from csd.bench.synthetic.models import IdTokenizer
from csd.config import CSDConfig
from csd.costs import CostModel
from csd.decode import Decoder
from csd.memory import CorrectionMemory
from csd.runtime.lm import LeanLM
from csd.runtime.static import CapacityError, StaticLM, draft_shapes, make_static, target_shapes

PROMPT = [3, 7, 1, 4, 9, 2]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def models():
    target = tiny_model(2)
    return target, perturbed(target, 0.05)


def pairs(models, capacity=128, device="cpu", compiled=False):
    """The same two models through the eager lean path and through the static one (compiled: through
    ``torch.compile`` first)."""
    target, draft = (copy.deepcopy(m).to(device) for m in models)
    eager = make_pair(IdTokenizer(), target, draft, draft_lm=LeanLM(draft))     # no model files: runs on any device
    eager.target_lm = LeanLM(target)
    static = make_pair(IdTokenizer(), target, draft)
    static.target_lm = make_static(LeanLM(target), capacity, target_shapes(8), name="target", compiled=compiled)
    static.draft_lm = make_static(LeanLM(draft), capacity, draft_shapes(), name="draft", compiled=compiled)
    eager.device = static.device = torch.device(device)
    return eager, static


def run(pair, cfg):
    r = Decoder(pair, online_costs=False).run(PROMPT, cfg, CorrectionMemory(pair.pair_id))
    list(r)
    return r


def assert_same_or_near_tie(pair, a: list[int], b: list[int]) -> None:
    """Token-identical, except where the target's own top two were within float rounding at the first
    difference (attention over the masked capacity sums in another order than over the held keys)."""
    if a == b:
        return
    differ = [k for k, (x, y) in enumerate(zip(a, b)) if x != y]
    i = differ[0] if differ else min(len(a), len(b))      # the first position where they part
    with torch.no_grad():
        logits = pair.target(torch.tensor([PROMPT + a[:i]], device=pair.target.device)).logits[0, -1].float()
    top2 = logits.topk(2).values
    assert float(top2[0] - top2[1]) < 1e-4, f"static and eager differ at token {i} with a clear top-1"


def test_a_static_pass_computes_the_eager_pass(models):
    target = models[0]
    eager, static = LeanLM(target), StaticLM(LeanLM(target), capacity=64)
    ce, cs = eager.new_cache(), static.new_cache()
    g = torch.Generator().manual_seed(0)
    for t, crop_to in ((5, None), (1, None), (4, 7), (3, 5), (1, None), (7, 9)):
        ids = torch.randint(0, 32, (t,), generator=g)
        le, ls = eager.forward(ce, ids, t), static.forward(cs, ids, t)
        assert ls.shape == le.shape
        torch.testing.assert_close(ls, le, rtol=1e-5, atol=1e-5)
        assert static.length(cs) == eager.length(ce)
        if crop_to is not None:               # a rollback moves a length on both
            eager.crop(ce, crop_to)
            static.crop(cs, crop_to)
    assert static.eager_passes == 6 and static.replays == 0      # no graphs on the CPU


@pytest.mark.parametrize("reduced", [False, True], ids=["full", "reduced-vocabulary"])
def test_a_draft_block_drafts_what_its_steps_draft(models, reduced):
    """``StaticLM.draft_block`` (one graph on CUDA) against the steps ``csd.decode`` took one by one: the
    same proposals, the cache as long, and the next pass sees the same keys."""
    draft = models[1]
    ids = torch.arange(0, 32, 2) if reduced else None
    block_lm, step_lm = (StaticLM(LeanLM(draft, vocab_ids=ids), capacity=300) for _ in range(2))
    cb, cs = block_lm.new_cache(), step_lm.new_cache()
    for lm, c in ((block_lm, cb), (step_lm, cs)):
        lm.forward(c, PROMPT * 40, 1)                     # 240 tokens: the blocks cross the 256 span's edge
    for feed, g in (([3], 6), ([5, 9], 16), ([1], 1)):
        got = block_lm.draft_block(cb, feed, g)
        x, stepped = feed, []
        for _ in range(g):
            i = step_lm.forward(cs, x, 1)[-1].argmax()
            x = [int(ids[i]) if reduced else int(i)]
            stepped += x
        assert got.tolist() == stepped and block_lm.length(cb) == step_lm.length(cs)
        torch.testing.assert_close(block_lm.forward(cb, [4], 1), step_lm.forward(cs, [4], 1))
    assert block_lm.block_replays == 0 and block_lm.eager_passes > 0          # no graphs on the CPU
    with pytest.raises(CapacityError, match="draft block"):
        block_lm.draft_block(cb, [1], 200)


def test_a_pass_attends_over_the_smallest_span_that_holds_it(models):
    """Attention reads the cache's first 256, 1024 or all 2048 positions, whichever first holds the pass
    (the GPU issue: a pass over the whole capacity cost what the cache could hold, not what it held); the
    logits are the eager pass's on either side of each span's edge."""
    from csd.runtime.static import attention_spans
    assert attention_spans(2048) == [256, 1024, 2048] and attention_spans(128) == [128]
    assert attention_spans(256) == [256] and attention_spans(300) == [256, 300]
    target = models[0]
    eager, static = LeanLM(target), StaticLM(LeanLM(target), capacity=2048)
    assert [static.span(n) for n in (1, 256, 257, 1024, 1025, 2048)] == [256, 256, 1024, 1024, 2048, 2048]
    ce, cs = eager.new_cache(), static.new_cache()
    g = torch.Generator().manual_seed(1)
    for t in (200, 50, 7, 1, 800, 7, 1):               # ends 200, 250, 257, 258, 1058, 1065, 1066
        ids = torch.randint(0, 32, (t,), generator=g)
        keep = min(t, 7)
        torch.testing.assert_close(static.forward(cs, ids, keep), eager.forward(ce, ids, keep), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", [CSDConfig(method="ar", max_new_tokens=40),
                                 CSDConfig(method="sd", gamma=4, max_new_tokens=40, lookup=0),
                                 CSDConfig(method="sd", gamma=6, max_new_tokens=40),
                                 CSDConfig(method="csd", gamma=3, max_new_tokens=40, lookup=0)],
                         ids=["ar", "sd-gamma4", "sd-gamma6-copies", "csd-gamma3"])
def test_static_decoding_writes_the_eager_paths_tokens(models, cfg):
    eager, static = pairs(models)
    a, b = run(eager, cfg), run(static, cfg)
    assert_same_or_near_tie(eager, a.token_ids, b.token_ids)
    assert b.metrics.target_forwards == a.metrics.target_forwards or a.token_ids != b.token_ids


def test_static_sd_equals_static_ar(models):
    _, static = pairs(models)
    ar = run(static, CSDConfig(method="ar", max_new_tokens=48)).token_ids
    sd = run(static, CSDConfig(method="sd", gamma=5, max_new_tokens=48, lookup=0))
    assert_same_or_near_tie(static, ar, sd.token_ids)
    assert sd.metrics.target_forwards < 48           # the close draft's blocks were kept: fewer passes than tokens


def test_a_run_the_cache_cannot_hold_is_refused_before_any_pass(models):
    _, static = pairs(models, capacity=48)
    with pytest.raises(CapacityError, match=r"holds 48.*--static-capacity"):
        Decoder(static, online_costs=False).run(PROMPT, CSDConfig(method="sd", gamma=6, max_new_tokens=40))
    with pytest.raises(CapacityError, match="holds 48"):   # AR: the prompt and the answer alone
        Decoder(static, online_costs=False).run(PROMPT, CSDConfig(method="ar", max_new_tokens=43))
    assert static.target_lm.eager_passes == static.target_lm.replays == 0
    assert static.draft_lm.eager_passes == 0
    run(static, CSDConfig(method="ar", max_new_tokens=41))       # 6 + 41 + 1 fits


def test_one_run_at_a_time_and_rollbacks_stay_in_bounds(models):
    lm = StaticLM(LeanLM(models[0]), capacity=16)
    old = lm.new_cache()
    lm.forward(old, [1, 2, 3], 1)
    new = lm.new_cache()
    with pytest.raises(RuntimeError, match="one run at a time"):
        lm.forward(old, [4], 1)
    lm.forward(new, [1, 2], 1)
    with pytest.raises(ValueError, match="cannot crop"):
        lm.crop(new, 3)
    with pytest.raises(CapacityError, match="holds 16"):
        lm.forward(new, list(range(15)), 1)
    assert lm.length(new) == 2                      # the refused pass changed nothing
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        lm.capture([(1, 1)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the graphs); the CPU tests above "
                                                          "cover the function they capture")
@pytest.mark.parametrize("compiled", [False, True], ids=["static", "compiled"])
def test_captured_graphs_replay_the_eager_tokens(models, compiled):
    eager, static = pairs(models, device="cuda", compiled=compiled)
    for cfg in (CSDConfig(method="ar", max_new_tokens=32),
                CSDConfig(method="sd", gamma=4, max_new_tokens=32, lookup=0)):
        a, b = run(eager, cfg), run(static, cfg)
        assert_same_or_near_tie(eager, a.token_ids, b.token_ids)
    assert static.target_lm.replays > 0 and static.draft_lm.block_replays > 0    # a draft block: one replay
    assert any(k[0] == "block" for k in static.draft_lm.graphs)


def test_a_draft_with_more_padding_rows_proposes_among_the_shared_ones(models):
    """Qwen2.5-0.5B (151936 output rows) drafting for Qwen2.5-7B (152064) for 151665 tokens: the draft
    proposes among the rows both have, and greedy SD still writes AR's tokens."""
    from csd.runtime.models import shared_rows
    from csd.runtime.pair import ModelLoadError
    assert shared_rows(151936, 151936, 151665) is None
    assert shared_rows(151936, 152064, 151665) == shared_rows(152064, 151936, 151665) == 151936
    with pytest.raises(ModelLoadError, match="lacks rows"):
        shared_rows(151000, 152064, 151665)
    target, wide = models[0], tiny_model(1, vocab=40)          # rows 32..39: padding the target lacks
    pair = make_pair(IdTokenizer(), target, wide,
                     draft_lm=LeanLM(wide, vocab_ids=torch.arange(shared_rows(40, 32, 30))))
    ar = run(pair, CSDConfig(method="ar", max_new_tokens=30)).token_ids
    sd = run(pair, CSDConfig(method="sd", gamma=4, max_new_tokens=30, lookup=0))
    assert sd.token_ids == ar
    proposed = [e.draft_id for e in sd.events if e.draft_id is not None]
    assert proposed and max(proposed) < 32


def test_the_exact_int8_stays_exact_on_the_static_path(one_thread):
    """An int8 target with per-token activation scales (csd.runtime.quant.RowInt8Linear): a static verify pass
    gives each position the logits a 1-token static step gives it, bit for bit, so SD writes AR's tokens."""
    from csd.runtime.quant import quantize_int8
    target = tiny_model(2, hidden=64)
    int8 = quantize_int8(copy.deepcopy(target)).eval()
    lean = LeanLM(int8)
    lean.int8_per_row()
    lm = StaticLM(lean, capacity=1024)      # a long context over a large capacity: where a batched attention
    prompt = [(7 * i) % 32 for i in range(150)]            # of the pass would round unlike single queries
    with torch.inference_mode():
        a = lm.new_cache()
        lm.forward(a, prompt, 1)
        block = lm.forward(a, [9, 2, 11, 5, 6, 7, 8], 7)
        b = lm.new_cache()
        lm.forward(b, prompt, 1)
        steps = torch.cat([lm.forward(b, [x], 1) for x in (9, 2, 11, 5, 6, 7, 8)])
    assert torch.equal(block, steps)
    pair = make_pair(IdTokenizer(), int8, perturbed(target, 0.3))
    pair.target_lm = lm
    ar = run(pair, CSDConfig(method="ar", max_new_tokens=40)).token_ids
    sd = run(pair, CSDConfig(method="sd", gamma=5, max_new_tokens=40, lookup=0))
    assert sd.token_ids == ar and any(e.status == "rejected" for e in sd.events)


def test_a_float_lean_model_holds_its_fused_weights_once():
    """The fused q/k/v and gate/up rows are the transformers model's own storage (views), so building
    the lean path over a float model does not double its memory, and the model still computes as before."""
    model = tiny_model(3)
    ids = torch.tensor([[3, 7, 1, 4, 9]])
    with torch.no_grad():
        before = model(ids).logits
    lean = LeanLM(model)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    qkv, gate_up = lean.layers[0][1], lean.layers[0][4]
    assert attn.q_proj.weight.untyped_storage().data_ptr() == qkv.weight.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == gate_up.weight.untyped_storage().data_ptr()
    assert torch.equal(attn.k_proj.weight, qkv.weight[attn.q_proj.out_features:][:attn.k_proj.out_features])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    with torch.inference_mode():
        torch.testing.assert_close(lean.forward(lean.new_cache(), ids[0], 5), before[0], rtol=1e-5, atol=1e-5)


HOST_READS = ("aten._local_scalar_dense", "aten.nonzero", "aten.is_nonzero", "aten.equal")


@pytest.mark.parametrize("cfg", [CSDConfig(method="csd", gamma=4, max_new_tokens=40, lookup=0),
                                 CSDConfig(method="sd", gamma="auto", max_new_tokens=40, lookup=0)],
                         ids=["csd-gamma4", "sd-auto"])
def test_the_static_loop_reads_no_device_value_but_its_one_transfer(models, cfg, monkeypatch):
    """What CUDA's graphs and a sync-free loop need, checked on the CPU: no op of a run waits on a
    tensor's value on the host (``.item()``, ``bool(t)``, ``nonzero``: each a hidden sync on a GPU), so
    the engine's own counted transfer (``.tolist()`` of the block, one per target pass) is the only
    one. Gamma auto runs as on a GPU (``SYNC_FREE_AUTO_DEVICES``)."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    import csd.decode

    class HostReads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func).startswith(HOST_READS):
                self.seen[str(func)] += 1
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(csd.decode, "SYNC_FREE_AUTO_DEVICES", ("cpu",))
    _, static = pairs(models)
    cheap = CostModel({k: 100.0 + k for k in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33)}, 5.0)  # long blocks
    with HostReads() as reads:
        r = Decoder(static, costs=cheap, online_costs=False).run(PROMPT, cfg, CorrectionMemory(static.pair_id))
        list(r)
    assert r.metrics.host_syncs == r.metrics.target_forwards and len(r.token_ids) == 40
    assert reads.seen == {}
    with HostReads() as probe:                         # the probe sees such a read where one is made
        bool(torch.tensor([1.0]).sum() > 0)
    assert probe.seen == {"aten._local_scalar_dense.default": 1}


def test_the_profile_times_a_static_cache_smaller_than_its_context():
    """gamma auto's profile times passes after 150 cached tokens; a smaller static cache (``--static-capacity
    64``) is timed after what it holds instead of refusing the pass."""
    from csd.runtime.profile import CONTEXT, time_pass

    lm = make_static(LeanLM(tiny_model(3, vocab=1200)), 64, target_shapes(8), name="target")
    assert CONTEXT + 8 > lm.capacity
    assert time_pass(lm, 8, reps=1) > 0 and time_pass(lm, 1, reps=1) > 0


def test_the_compiled_engine_writes_the_static_paths_tokens_from_a_few_compiles(models):
    """``--engine compiled``: the static pass through ``torch.compile`` with the pass length symbolic,
    compiled at load (here, without graphs: one pass of 1 token and one of 2) in two classes per model rather
    than once per shape, and writing the static path's tokens."""
    from torch._dynamo.utils import counters

    _, static = pairs(models)
    before = counters["stats"]["unique_graphs"]
    _, compiled = pairs(models, compiled=True)
    graphs = counters["stats"]["unique_graphs"] - before
    assert compiled.describe()["engine"] == "compiled" and compiled.target_lm.capture_s > 0
    assert 0 < graphs <= 4, f"{graphs} compiled graphs for 10 pass shapes"    # per model: 1 token, several
    for cfg in (CSDConfig(method="ar", max_new_tokens=40),
                CSDConfig(method="sd", gamma=4, max_new_tokens=40, lookup=0)):
        assert_same_or_near_tie(static, run(compiled, cfg).token_ids, run(static, cfg).token_ids)
    assert counters["stats"]["unique_graphs"] - before == graphs            # nothing compiled during the runs


def test_a_compiler_that_fails_is_named_with_the_way_out(models, monkeypatch):
    """A machine where torch.compile cannot work (no C compiler, no Triton) gets a sentence naming the
    model and ``--engine static``, not the compiler's traceback."""
    from csd.runtime.static import CompileError

    def broken(fn):
        def run(*_a, **_k):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore lines")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.raises(CompileError, match=r"the draft's pass .*InvalidCxxCompiler.*use --engine static"):
        make_static(LeanLM(copy.deepcopy(models[1])), 64, draft_shapes(), name="draft", compiled=True)


def test_this_file_runs_where_only_torch_and_transformers_are(tmp_path):
    """bench/gpu.sh runs this file on a bare GPU image (2026-12-04: it could not start there, since the
    store's fixtures import sqlalchemy). The store's, the app's and the figures' packages are shadowed by
    ones that fail to import; the file is collected and its first test runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    for name in ("sqlalchemy", "alembic", "psycopg", "gradio", "plotly", "pandas"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} is not on this image')\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__)),
                          "-k", "a_static_pass_computes_the_eager_pass"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def tiny_pass_ops(gamma: int = 6) -> dict[str, int]:
    """Computing ops of the tiny synthetic pair's static calls on the CPU (held below to the counts committed in
    ``docs/bench/static-ops/counts.json``): per draft step, draft block of ``gamma``, and verify pass of 1 and 7
    tokens."""
    from csd.bench.synthetic.kernel_profile import VERIFY_LENGTHS, count_ops, launches, static_lm
    from csd.runtime.static import draft_shapes
    cpu = torch.device("cpu")
    draft = static_lm("tiny-draft", cpu, torch.float32, 128, draft_shapes())
    target = static_lm("tiny-target", cpu, torch.float32, 128, draft_shapes())
    dc, tc = draft.new_cache(), target.new_cache()
    draft.forward(dc, list(range(20)), 1)
    target.forward(tc, list(range(20)), 1)
    out = {"draft step": launches(count_ops(lambda: draft.forward(dc, [7], 1))),
           f"draft block of {gamma}": launches(count_ops(lambda: draft.draft_block(dc, torch.tensor([7]), gamma)))}
    for t in VERIFY_LENGTHS:
        target.crop(tc, 20)
        out[f"verify pass of {t}"] = launches(count_ops(lambda t=t: target.forward(tc, [7] * t, t)))
    return out


def test_a_static_pass_dispatches_no_more_ops_than_committed():
    """Fewer, fatter kernels (the GPU issue: a 0.5B draft step launched about a thousand): the computing ops
    each static call dispatches, counted by a dispatch mode, stay at or under the committed ceiling
    (docs/bench/static-ops/counts.json holds the counts before and after each reduction)."""
    import json
    from pathlib import Path

    committed = json.loads((Path(__file__).resolve().parents[1] / "docs/bench/static-ops/counts.json").read_text())
    counts = tiny_pass_ops()
    assert set(counts) == set(committed["ceiling"])
    grown = {k: (n, committed["ceiling"][k]) for k, n in counts.items() if n > committed["ceiling"][k]}
    assert not grown, f"ops a call grew past the committed ceiling (now, ceiling): {grown}"
    assert counts["draft step"] < committed["before"]["counts"]["draft step"]
