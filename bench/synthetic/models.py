"""The synthetic benchmark's models: real architectures, seeded random weights scaled so that greedy
output does not cycle, and a draft whose acceptance is set by a script (docs/gpu.md)."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from csd.representation import Representation
from csd.runtime.lm import LM, ids_tensor

_QWEN2 = dict(model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
              max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
              use_sliding_window=False, attention_dropout=0.0)
VOCAB = 151936     # the embedded pair's output layer (Qwen2.5-7B's own is 152064)
ARCHS: dict[str, dict] = {
    # copied from the embedded pair's config.json (qwen2.5-coder-{0.5b,1.5b}-instruct-q4_k_m)
    "qwen2.5-coder-0.5b-instruct": dict(_QWEN2, vocab_size=VOCAB, hidden_size=896, intermediate_size=4864,
                                        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
    "qwen2.5-coder-1.5b-instruct": dict(_QWEN2, vocab_size=VOCAB, hidden_size=1536, intermediate_size=8960,
                                        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2),
    # Qwen2.5-7B
    "qwen2.5-7b": dict(_QWEN2, vocab_size=VOCAB, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4),
    # the CPU and test pair (vocab > 250: csd.runtime.profile.time_pass feeds ids up to 249)
    "tiny-draft": dict(_QWEN2, vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
    "tiny-target": dict(_QWEN2, vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096),
}
PAIRS = {"tiny": ("tiny-draft", "tiny-target"),
         "1.5b": ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"),
         "7b": ("qwen2.5-coder-0.5b-instruct", "qwen2.5-7b")}
PAIR_CHOICES = ("auto",) + tuple(PAIRS)
ATTN_LOGIT_STD = 2.0     # std of q.k / sqrt(d) at init: position-dependent, not so sharp that rounding is amplified
LOGIT_STD = 4.0          # std of the output logits at init
BIG = 1e4                # added to the scripted token's draft logit: it becomes the argmax


class IdTokenizer:
    """The little of a tokenizer that the engine needs for random ids: each id's text is itself."""
    eos_token_id = pad_token_id = chat_template = None

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(str(int(i)) for i in ids)


@torch.no_grad()
def synthetic_init(model: torch.nn.Module, generator: torch.Generator, attn_logit_std: float = ATTN_LOGIT_STD,
                   logit_std: float = LOGIT_STD) -> torch.nn.Module:
    """Every parameter, in a fixed order, from ``generator``: unit-gain fan-in scaling, sharper attention
    and output logits (docs/gpu.md); RMSNorm gains 1, biases 0."""
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.fill_(1.0 if "norm" in name else 0.0)
            continue
        fan_in = p.shape[1]
        if name.endswith("embed_tokens.weight"):
            std = 1.0
        elif ".q_proj." in name or ".k_proj." in name:     # q.k / sqrt(d) has std attn_logit_std
            std = math.sqrt(attn_logit_std / fan_in)
        elif name.startswith("lm_head"):                   # after the final norm: logits of std logit_std
            std = logit_std / math.sqrt(fan_in)
        else:
            std = 1.0 / math.sqrt(fan_in)
        p.normal_(0.0, std, generator=generator)
    return model


def build_model(arch: dict, device: torch.device, seed: int) -> torch.nn.Module:
    """A float32 Qwen2 causal LM of ``arch``'s shape on ``device``, initialised by ``synthetic_init`` alone."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    try:
        from transformers.initialization import no_init_weights
    except ImportError:                 # older transformers: initialise twice, slower but the same weights
        no_init_weights = contextlib.nullcontext
    cfg = Qwen2Config(**{k: v for k, v in arch.items() if k != "model_type"})
    with torch.device(device), no_init_weights():
        model = Qwen2ForCausalLM(cfg)
    gen = torch.Generator(device=device).manual_seed(seed)
    return synthetic_init(model, gen).eval()


@dataclass
class ScriptedCache:
    inner: object            # the draft's own cache
    ok: torch.Tensor         # (capacity + 1,) bool on the device: ok[j] = positions < j all follow the script


class ScriptedDraft(LM):
    """A draft whose acceptance is set: ``inner``'s forward pass (the real cost), then at each scripted
    position whose prefix follows the script the target's token wins (coin) or is masked (no coin).
    Elsewhere the logits are the draft's own. All on the device: no host synchronisation is added."""

    def __init__(self, inner: LM):
        if inner.vocab_ids is not None:
            raise ValueError("ScriptedDraft needs a full-vocabulary draft")
        self.inner = inner
        self.impl = f"scripted-{inner.impl}"
        self._path = self._idx = self._boost = None   # (N,) the script's tables on the device
        # over a static draft the tables and the one cache's flags keep their addresses (a captured draft
        # block reads them): sized once to the capacity, written in place
        cap = getattr(inner, "capacity", None)
        self._fixed = None if cap is None else {
            "path": torch.full((cap + 2,), -1, dtype=torch.long, device=inner.device),
            "idx": torch.zeros(cap + 2, dtype=torch.long, device=inner.device),
            "boost": torch.zeros(cap + 2, device=inner.device),
            "ok": torch.zeros(cap + 2, dtype=torch.bool, device=inner.device),
            "steps": torch.arange(cap + 2, device=inner.device)}
        if self._fixed is not None:
            self.draft_block = self._draft_block

    @property
    def device(self) -> torch.device:
        return self.inner.device

    @property
    def captures(self) -> int:
        return self.inner.captures

    def script(self, path: list[int] | None, want: list[int] | None = None, coins: torch.Tensor | None = None) -> None:
        """``path``: the committed sequence (prompt + new tokens); ``want``: per position, the token
        the target will choose there (-1 for none: the prompt); ``coins``: (N >= len(path),) bool,
        True where the draft proposes ``want``. ``None`` turns the script off (the plain draft)."""
        if path is None:
            self._path = self._idx = self._boost = None
            return
        if want is None or coins is None:
            raise ValueError("a script needs the target's tokens and the coins")
        n = max(len(path) + 1, len(coins))
        path_t = torch.tensor([*path] + [-1] * (n - len(path)), dtype=torch.long)
        want_t = torch.tensor([*want] + [-1] * (n - len(want)), dtype=torch.long)
        coin = torch.zeros(n, dtype=torch.bool)
        coin[:len(coins)] = coins.cpu()
        boost = torch.where(coin, torch.tensor(BIG), torch.tensor(-math.inf))
        boost = torch.where(want_t >= 0, boost, torch.tensor(0.0))
        dev = self.device
        self._path, self._idx, self._boost = path_t.to(dev), want_t.clamp_min(0).to(dev), boost.to(dev)
        if self._fixed is not None:           # in place, cut to the capacity (no position lies beyond it)
            for name, t, empty in (("path", self._path, -1), ("idx", self._idx, 0), ("boost", self._boost, 0.0)):
                buf = self._fixed[name]
                buf.fill_(empty)
                buf[:len(t)] = t[:len(buf)]
            self._path, self._idx, self._boost = (self._fixed[k] for k in ("path", "idx", "boost"))

    def _fit(self, n: int) -> None:
        """Tables reach position n - 1 (past the script: no effect)."""
        extra = n - self._path.numel()
        if extra > 0:
            self._path = torch.cat([self._path, self._path.new_full((extra,), -1)])
            self._idx = torch.cat([self._idx, self._idx.new_zeros(extra)])
            self._boost = torch.cat([self._boost, self._boost.new_zeros(extra)])

    def new_cache(self) -> ScriptedCache:
        fixed = self._fixed is not None       # the static draft's one cache: its flags, reset in place
        ok = self._fixed["ok"].zero_() if fixed else torch.zeros(257, dtype=torch.bool, device=self.device)
        ok[0] = True
        return ScriptedCache(self.inner.new_cache(), ok)

    def _draft_block(self, cache: ScriptedCache, feed, g: int) -> torch.Tensor:
        """``csd.runtime.static.StaticLM.draft_block`` with the script's coin inside the block (one graph on
        CUDA); the ``draft_block`` of a scripted static draft only (over another, csd.decode steps itself)."""
        return self.inner.draft_block(cache.inner, feed, g, self._adjust(cache) if self._path is not None else None)

    def _adjust(self, cache: ScriptedCache):
        """``forward``'s coin for one step at a device position: reads and writes fixed buffers only."""
        steps = self._fixed["steps"]

        def adjust(logits: torch.Tensor, first: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            p = first + steps[:x.numel()]                                               # (t,) positions of x
            match = (x == self._path[p]).long().cumprod(0).bool()
            cache.ok[p + 1] = match & cache.ok[first]
            row = p[-1:] + 1                                                            # the position predicted
            add = torch.where(cache.ok[row], self._boost[row], torch.zeros_like(self._boost[row]))
            return logits.scatter_add(1, self._idx[row][:, None], add[:, None])
        return adjust

    def length(self, cache: ScriptedCache) -> int:
        return self.inner.length(cache.inner)

    def crop(self, cache: ScriptedCache, length: int) -> None:
        self.inner.crop(cache.inner, length)       # ok[:length + 1] depends on the kept tokens only

    def forward(self, cache: ScriptedCache, ids: list[int] | torch.Tensor, keep: int) -> torch.Tensor:
        x = ids_tensor(ids, self.device)       # as the engine's models do: no host sync for a list of ids
        start, t = self.inner.length(cache.inner), x.numel()
        logits = self.inner.forward(cache.inner, x, keep)                          # (keep, V): the real cost
        if self._path is None:
            return logits
        end = start + t
        self._fit(end + 1)
        if cache.ok.numel() < end + 1:
            cache.ok = torch.cat([cache.ok, cache.ok.new_zeros(max(end + 1, 2 * cache.ok.numel()) - cache.ok.numel())])
        match = (x == self._path[start:end]).long().cumprod(0).bool()             # (t,)
        cache.ok[start + 1:end + 1] = match & cache.ok[start]
        rows = slice(end - keep + 1, end + 1)                                       # row i predicts position rows[i]
        add = torch.where(cache.ok[rows], self._boost[rows], 0.0)                   # (keep,)
        return logits.scatter_add(1, self._idx[rows, None], add[:, None])


def make_pair(name: str, draft_model, target_model, device: torch.device,
              reprs: tuple[str, str] = ("float32", "float32"), draft_impl: str = "auto",
              static: tuple[str, int] = ("eager", 0)):
    """A ``ModelPair`` of the two models in ``reprs`` (the target's, the draft's; converted in place) with a
    ``ScriptedDraft`` over the lean (or hf) draft. ``static``: (engine, cache capacity); "static" or
    "compiled" runs both lean at fixed shapes with CUDA graphs captured here, as
    ``csd.runtime.models.load_pair`` does."""
    (target_rep, draft_rep), (engine, capacity) = reprs, static
    from csd.config import GAMMA_RANGE
    from csd.runtime.lm import HFLM, LeanLM
    from csd.runtime.pair import ModelPair
    from csd.runtime.quant import DTYPES, quantize_int8, to_repr
    from csd.runtime.static import STATIC_ENGINES, draft_shapes, make_static, target_shapes

    d_arch, t_arch = PAIRS[name]
    if target_rep != "float32" or target_model.dtype != torch.float32:
        target_model = to_repr(target_model, target_rep)
    int8 = draft_rep == "int8"
    if not int8:
        draft_model = draft_model.to(DTYPES[draft_rep])
    lean = draft_impl in ("auto", "lean")
    inner = LeanLM(draft_model, int8=int8) if lean else None        # built from the float weights
    if int8:
        draft_model = quantize_int8(draft_model).eval()
    if not lean:
        inner = HFLM(draft_model)
    target_lm = HFLM(target_model)
    if engine in STATIC_ENGINES:
        if not lean:
            raise ValueError("the static engine runs the lean draft path (not --draft-impl hf)")
        compiled = engine == "compiled"
        target_lm = make_static(LeanLM(target_model), capacity, target_shapes(GAMMA_RANGE[1] + 1), name="target",
                                compiled=compiled)
        inner = make_static(inner, capacity, draft_shapes(), name="draft", compiled=compiled)
    act = torch.float32 if target_rep == "int8" else DTYPES[target_rep]
    ctx = int(target_model.config.max_position_embeddings)
    return ModelPair(draft_model, target_model, IdTokenizer(), f"synthetic-{name}", d_arch, t_arch, device, act, (),
                     ctx, rep=Representation(target_rep, draft_rep), special_ids=frozenset(),
                     target_lm=target_lm, draft_lm=ScriptedDraft(inner),
                     draft_vocab_size=draft_model.get_output_embeddings().out_features)
