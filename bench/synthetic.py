"""Synthetic benchmark: AR, SD and CSD measured by the project's own engine (``csd.decode``) on
randomly initialised models with real architectures, where no weights can travel (a GPU machine
without network or model cache). Calibrated Speculative Decoding: arXiv 2604.13634.

On a GPU machine (on an NVIDIA H200, 2026-11-30: about 110 s for the 1.5B pair with 3 prompts and one
timed run each, 150 s for the 7B target; ``bench/gpu.sh`` runs the set, README "GPU" has the figures):

    python -m bench.synthetic --synthetic-config 1.5b --max-new-tokens 128 --limit 3 --out synthetic-1.5b
    python -m csd bench --synthetic --synthetic-config 1.5b --max-new-tokens 128 --limit 3 --out synthetic-1.5b

The first needs only torch, transformers and numpy; the second, the ``csd`` command line, also
imports the store (sqlalchemy), which the GPU image lacks. The 7B target: ``--synthetic-config 7b``.

What is real, and what is made up:
- The architectures (``ARCHS``) are the embedded pair's, copied from its ``config.json`` files
  (Qwen2.5-Coder-0.5B-Instruct draft, Qwen2.5-Coder-1.5B-Instruct target), plus a 7B-class target
  (Qwen2.5-7B) and a tiny pair for the CPU and the tests. The target runs through ``csd.lm.HFLM``
  and the draft through the lean path (``csd.lm.LeanLM``), as in the product, so every pass costs
  what it costs with real weights.
- The weights are random and seeded (``synthetic_init``). Transformers' own init (std 0.02) gives
  a network whose greedy output repeats one token or a short cycle: the residual stream is
  dominated by an almost uniform attention average. Here every matrix has unit-gain fan-in scaling
  (std 1/sqrt(fan_in), embeddings std 1), so every layer contributes at the scale of the
  embedding; q and k are scaled so that attention logits have std 2 (position-dependent attention
  through RoPE; 4 made the network chaotic enough to double bfloat16's logit noise), and the output
  layer so that the logits have std 4. The greedy output then depends on far context and does not
  cycle (``outputs`` in the results: distinct-token share, longest run of one token).
- Acceptance is set, not learnt. ``ScriptedDraft`` runs the draft's real forward pass for its cost
  and then, with a per-position coin of probability ``acceptance`` (seeded), proposes the target's
  own next token, or else its own argmax with that token masked out (so that the target rejects
  it). The target's next tokens come from a script: the committed path and the target's top-1 at
  each of its positions, first taken from the AR run of the same prompt (greedy SD commits AR's
  tokens). The coin is a table lookup on the device, and "does the committed prefix still follow
  the script" a running product kept per cache position on the device, so the draft adds no host
  synchronisation. Where a run leaves its script (a CSD rescue, or a representation whose top-1
  depends on the shape of the verify pass: bfloat16 rounds a 7-token pass differently from a
  1-token one) the draft falls back to its own argmax and that run's acceptance would not be the
  requested one. So a run counts only when it followed its script (a fixed point); otherwise its
  own path and top-1s become the script and it runs again, untimed, up to ``rehearsals`` times
  (``attempts`` and ``fixed_point`` in the results; each rerun follows the script further). In
  float32 greedy SD equals AR and the first run is a fixed point. Dynamic int8 quantises each pass
  with one activation scale, so a top-1 depends on the other tokens of its pass and random
  weights' small top-1 margins flip at most positions: no fixed point, acceptance collapses (use
  float32 on the CPU). Random weights also give CSD nothing to learn (its memory rarely sees a
  pattern twice and its gate rarely passes), so CSD here shows its cost over SD, not its gain.
- Acceptance is reported two ways: ``acceptance``, kept over decided draft positions (what
  ``--acceptance`` sets; positions discarded after a rejection are never decided), and
  ``acceptance_rate``, kept over proposed, as ``bench.harness`` reports it.
- Host-device synchronisations: ``RunMetrics.host_syncs`` counts the engine's own device-to-host
  transfers, one per block on the greedy fixed-gamma path; ``syncs_per_block`` reports it over
  the target passes. On CUDA one more untimed run per method counts every synchronising CUDA call
  that torch's sync debug mode sees (host-to-device copies of Python lists included) as
  ``cuda_syncs_per_block``.

Outputs in ``out_dir``: ``results.json`` (``summary["synthetic-<config>"][method]["tokens_per_s"]``
as in the normal benchmark) and ``results.md`` (the printed table).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import platform
import resource
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from csd.config import CSDConfig, parse_gamma
from csd.lm import LM, ids_tensor
from csd.profile import PASS_LENGTHS

from .io import command_line, fmt, now, write_json

# -- the architectures ------------------------------------------------------------------------------
_QWEN2 = dict(model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
              max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
              use_sliding_window=False, attention_dropout=0.0)
VOCAB = 151936     # the embedded pair's output layer (Qwen2.5-7B's own is 152064; the pair's is used)
ARCHS: dict[str, dict] = {
    # copied from the embedded pair's config.json (qwen2.5-coder-{0.5b,1.5b}-instruct-q4_k_m)
    "qwen2.5-coder-0.5b-instruct": dict(_QWEN2, vocab_size=VOCAB, hidden_size=896, intermediate_size=4864,
                                        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
    "qwen2.5-coder-1.5b-instruct": dict(_QWEN2, vocab_size=VOCAB, hidden_size=1536, intermediate_size=8960,
                                        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2),
    # Qwen2.5-7B
    "qwen2.5-7b": dict(_QWEN2, vocab_size=VOCAB, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4),
    # the CPU and test pair: seconds, not minutes (vocab > 250: csd.profile.time_pass feeds ids up to 249)
    "tiny-draft": dict(_QWEN2, vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
    "tiny-target": dict(_QWEN2, vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096),
}
PAIRS = {"tiny": ("tiny-draft", "tiny-target"),
         "1.5b": ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"),
         "7b": ("qwen2.5-coder-0.5b-instruct", "qwen2.5-7b")}
PAIR_CHOICES = ("auto",) + tuple(PAIRS)
METHODS = ("ar", "sd", "csd")
ATTN_LOGIT_STD = 2.0     # std of q.k / sqrt(d) at init: position-dependent attention, not so sharp that
                         # rounding is amplified (4 doubled the bfloat16 logit noise and its top-1 flips)
LOGIT_STD = 4.0          # std of the output logits at init
BIG = 1e4                # added to the scripted token's draft logit: it becomes the argmax


@dataclass(frozen=True)
class SyntheticConfig:
    pair: str = "auto"               # tiny, 1.5b or 7b (PAIRS); auto: 1.5b on CUDA, tiny on the CPU
    acceptance: float = 0.8          # probability that the draft proposes the target's own next token
    prompts: int = 10                # random prompts, each run by every method
    prompt_tokens: int = 32          # tokens per random prompt
    max_new_tokens: int = 128
    gamma: int | str = 6             # draft block length (paper default 6), or "auto"
    gamma_max: int = 16              # the longest block "auto" may draft
    lam: float = 6                   # CSD memory threshold (paper default)
    tau: float = 0.01                # CSD gate threshold (paper default)
    memory_mode: str = "online"      # online: CSD's memory evolves over the prompts; fresh: new per prompt
    seed: int = 0                    # weights, prompts and coins all follow from it
    device: str = "auto"             # auto: CUDA if available
    dtype: str = "auto"              # the target's representation; auto: bfloat16 on CUDA, float32 on the CPU
    draft_dtype: str = "auto"        # auto / same: the target's (int8 on the CPU when the target is int8)
    draft_impl: str = "auto"         # lean (auto) or hf
    pass_lengths: tuple[int, ...] = PASS_LENGTHS   # tokens per target pass in the verify-time table
    reps: int = 3                    # timed repetitions per pass length (median)
    warmup: bool = True              # one short untimed generation per method first
    rehearsals: int = 16             # untimed reruns allowed per method and prompt to reach the script's fixed point
    repeats: int = 1                 # timed runs of each counted run (the same path); the fastest counts: on a GPU
                                     # whose clocks follow the load, and on a shared host, one run is noisy
    check_tokens: int = 32           # length of the float32 SD == AR check when the timed runs are not float32
    check_prompts: int = 1           # prompts of that check
    threads: int | None = None       # CPU intra-op threads; None: torch's default, but 1 for the tiny pair (its
                                     # matrices are too small for threads to pay, and busy threads spin-wait)

    def validated(self) -> SyntheticConfig:
        if self.pair not in PAIR_CHOICES:
            raise ValueError(f"unknown synthetic config {self.pair!r}; choose {', '.join(PAIR_CHOICES)}")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"--acceptance must be in [0, 1], got {self.acceptance}")
        if self.prompts < 1 or self.prompt_tokens < 2 or self.max_new_tokens < 1:
            raise ValueError("--limit must be >= 1, --prompt-tokens >= 2 and --max-new-tokens >= 1 with --synthetic")
        if not self.pass_lengths or any(k < 1 for k in self.pass_lengths):
            raise ValueError("--pass-lengths must be positive whole numbers")
        if self.gamma == "auto" and len(set(self.pass_lengths)) < 2:
            raise ValueError("gamma auto needs at least two --pass-lengths to interpolate the target's cost")
        if self.memory_mode not in ("online", "fresh"):
            raise ValueError(f"memory mode must be online or fresh, got {self.memory_mode!r}")
        if self.rehearsals < 0 or self.check_tokens < 1 or self.check_prompts < 0:
            raise ValueError("--rehearsals must be >= 0")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or not 1 <= self.repeats <= 20:
            raise ValueError(f"--repeats must be a whole number in 1..20, got {self.repeats!r}")
        CSDConfig(gamma=self.gamma, gamma_max=self.gamma_max, lam=self.lam, tau=self.tau,
                  max_new_tokens=self.max_new_tokens).validated()
        return self


# -- models ------------------------------------------------------------------------------------------
class IdTokenizer:
    """The little of a tokenizer that the engine needs for random ids: each id's text is itself."""
    eos_token_id = None
    pad_token_id = None
    chat_template = None

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(str(int(i)) for i in ids)


@torch.no_grad()
def synthetic_init(model: torch.nn.Module, generator: torch.Generator, attn_logit_std: float = ATTN_LOGIT_STD,
                   logit_std: float = LOGIT_STD) -> torch.nn.Module:
    """Every parameter, in a fixed order, from ``generator``: unit-gain fan-in scaling, sharper
    attention, sharper output logits (see the module docstring); RMSNorm gains 1, biases 0."""
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
    """A float32 Qwen2 causal LM with ``arch``'s shape, built on ``device`` and initialised once
    by ``synthetic_init`` (transformers' own init is skipped where it can be: it would be overwritten)."""
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
    """A draft whose acceptance is set: it runs ``inner``'s forward pass (the real cost), then moves
    the logits of the rows that predict scripted positions. For position j whose prefix follows
    the script: coin[j] -> the scripted target token wins (+BIG); no coin -> it is masked (-inf)
    and the draft's own argmax stands. Elsewhere (no script, off the path, past its end) the logits
    are the draft's own. All on the device: no host synchronisation is added."""

    def __init__(self, inner: LM):
        if inner.vocab_ids is not None:
            raise ValueError("ScriptedDraft needs a full-vocabulary draft")
        self.inner = inner
        self.impl = f"scripted-{inner.impl}"
        self._path = self._idx = self._boost = None   # (N,) the script's tables on the device

    @property
    def device(self) -> torch.device:
        return self.inner.device

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
        path_t = torch.full((n,), -1, dtype=torch.long)
        path_t[:len(path)] = torch.tensor(path, dtype=torch.long)
        want_t = torch.full((n,), -1, dtype=torch.long)
        want_t[:len(want)] = torch.tensor(want, dtype=torch.long)
        coin = torch.zeros(n, dtype=torch.bool)
        coin[:len(coins)] = coins.cpu()
        boost = torch.where(coin, torch.tensor(BIG), torch.tensor(-math.inf))
        boost = torch.where(want_t >= 0, boost, torch.tensor(0.0))
        dev = self.device
        self._path, self._idx, self._boost = path_t.to(dev), want_t.clamp_min(0).to(dev), boost.to(dev)

    def _fit(self, n: int) -> None:
        """Tables reach position n - 1 (past the script: no effect)."""
        extra = n - self._path.numel()
        if extra > 0:
            self._path = torch.cat([self._path, self._path.new_full((extra,), -1)])
            self._idx = torch.cat([self._idx, self._idx.new_zeros(extra)])
            self._boost = torch.cat([self._boost, self._boost.new_zeros(extra)])

    def new_cache(self) -> ScriptedCache:
        ok = torch.zeros(257, dtype=torch.bool, device=self.device)
        ok[0] = True
        return ScriptedCache(self.inner.new_cache(), ok)

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


def make_pair(name: str, draft_model, target_model, device: torch.device, target_repr: str, draft_repr: str,
              draft_impl: str):
    """A ``ModelPair`` of the two models in their representations (converted in place, as
    ``csd.models.load_pair`` does) with a ``ScriptedDraft`` over the lean (or hf) draft path."""
    from csd.lm import HFLM, LeanLM
    from csd.models import DTYPES, ModelPair, quantize_int8, to_repr

    d_arch, t_arch = PAIRS[name]
    if target_repr != "float32" or target_model.dtype != torch.float32:
        target_model = to_repr(target_model, target_repr)
    int8 = draft_repr == "int8"
    if not int8:
        draft_model = draft_model.to(DTYPES[draft_repr])
    lean = draft_impl in ("auto", "lean")
    inner = LeanLM(draft_model, int8=int8) if lean else None        # built from the float weights
    if int8:
        draft_model = quantize_int8(draft_model).eval()
    if not lean:
        inner = HFLM(draft_model)
    act = torch.float32 if target_repr == "int8" else DTYPES[target_repr]
    ctx = int(target_model.config.max_position_embeddings)
    return ModelPair(draft_model, target_model, IdTokenizer(), f"synthetic-{name}", d_arch, t_arch, device, act, (),
                     ctx, draft_dtype=draft_repr, target_repr=target_repr, special_ids=frozenset(),
                     target_lm=HFLM(target_model), draft_lm=ScriptedDraft(inner),
                     draft_vocab_size=draft_model.get_output_embeddings().out_features)


# -- running ------------------------------------------------------------------------------------------
@dataclass
class Measured:
    """One method on one prompt: the counted run (the last attempt)."""
    method: str
    prompt: int
    wall_s: float
    new_tokens: int
    target_passes: int
    draft_passes: int
    drafted: int
    decided: int                     # draft positions the target decided on (not discarded after a rejection)
    accepted: int
    rescued: int
    host_syncs: int
    draft_s: float
    verify_s: float
    bookkeeping_s: float
    attempts: int = 1                # runs until the script's fixed point (1: the first run followed its script)
    fixed_point: bool = True         # the counted run followed its script (its acceptance is the requested one)
    identical_to_ar: bool | None = None
    peak_bytes: int | None = None    # CUDA: torch.cuda.max_memory_allocated during this run
    token_ids: list = field(default_factory=list)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _script_of(prompt: list[int], run) -> tuple[list[int], list[int]]:
    """The path a run committed, and the target's top-1 at each of its new positions."""
    want = [e.target_id for e in run.events if e.in_output]
    return prompt + list(run.token_ids), [-1] * len(prompt) + want


def _coins(n: int, acceptance: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=g) < acceptance


def _timed(pair, decoder, prompt: list[int], cfg: CSDConfig, memory):
    """(run, wall seconds, peak CUDA bytes or None), the wall time taken around the whole generation."""
    dev = pair.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    run = decoder.run(prompt, cfg, memory)
    for _ in run:
        pass
    _sync(dev)
    wall = time.perf_counter() - t0
    return run, wall, (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None)


def _measured(method: str, k: int, run, wall: float, peak) -> Measured:
    m = run.metrics
    return Measured(method, k, wall, m.new_tokens, m.target_forwards, m.draft_forwards, m.drafted,
                    sum(m.per_position_drafted), m.accepted, m.rescued, m.host_syncs, m.draft_s, m.verify_s,
                    m.bookkeeping_s, peak_bytes=peak, token_ids=list(run.token_ids))


def _fastest(pair, decoder, prompt: list[int], cfg: CSDConfig, memory, run, wall: float, repeats: int) -> float:
    """The counted run's wall time: the fastest of it and ``repeats - 1`` reruns of the same path
    (the draft's script is left as it was, the memory restarts from ``memory``)."""
    for _ in range(repeats - 1):
        again, w, _ = _timed(pair, decoder, prompt, cfg, memory.copy() if memory is not None else None)
        if list(again.token_ids) == list(run.token_ids):
            wall = min(wall, w)
    return wall


def scripted_run(pair, decoder, prompt: list[int], cfg: CSDConfig, memory, script, coins, rehearsals: int,
                 repeats: int = 1):
    """Run until the run follows its script (see the module docstring): returns the counted run, its
    wall time (the fastest of ``repeats`` runs) and peak, the memory it leaves, the number of
    attempts, whether it is a fixed point and its own script."""
    for attempt in range(1, rehearsals + 2):
        pair.draft_lm.script(*script, coins)
        mem = memory.copy() if memory is not None else None
        run, wall, peak = _timed(pair, decoder, prompt, cfg, mem)
        own = _script_of(prompt, run)
        if own == script or attempt == rehearsals + 1:
            wall = _fastest(pair, decoder, prompt, cfg, memory, run, wall, repeats)
            return run, wall, peak, mem, attempt, own == script, own
        script = own
    raise AssertionError("unreachable")


def count_cuda_syncs(fn) -> int | None:
    """Synchronising CUDA calls made by ``fn()``, as torch's sync debug mode sees them (None off CUDA)."""
    if not torch.cuda.is_available():
        return None
    prev = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(prev)
    return sum("synchronizing CUDA operation" in str(w.message) for w in caught)


def check_sd_equals_ar(pair, prompts: list[list[int]], tokens: int, gamma: int, acceptance: float, seed: int) -> dict:
    """Greedy SD against AR token for token on ``prompts`` (the pair as it is: call it in float32)."""
    from csd.decode import Decoder
    from csd.memory import CorrectionMemory

    decoder = Decoder(pair)                    # fixed gamma: no cost model needed
    same, first_diff = 0, []
    for k, prompt in enumerate(prompts):
        ar, _, _ = _timed(pair, decoder, prompt, CSDConfig(method="ar", max_new_tokens=tokens), None)
        pair.draft_lm.script(*_script_of(prompt, ar), _coins(len(prompt) + tokens + 64, acceptance, seed + k))
        sd, _, _ = _timed(pair, decoder, prompt, CSDConfig(method="sd", gamma=gamma, max_new_tokens=tokens),
                          CorrectionMemory(pair.pair_id))
        same += sd.token_ids == ar.token_ids
        first_diff.append(next((i for i, (a, b) in enumerate(zip(ar.token_ids, sd.token_ids)) if a != b), None))
    pair.draft_lm.script(None)
    return {"dtype": pair.target_repr, "prompts": len(prompts), "tokens": tokens, "gamma": gamma,
            "identical": same, "passed": same == len(prompts), "first_difference": first_diff}


def _random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


def _reprs(cfg: SyntheticConfig, device: torch.device) -> tuple[str, str]:
    from csd.models import DRAFT_DTYPES, ModelLoadError, check_repr

    target = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    target = check_repr(target, device)
    if cfg.draft_dtype not in DRAFT_DTYPES:
        raise ModelLoadError(f"unknown draft dtype {cfg.draft_dtype!r}; choose {', '.join(DRAFT_DTYPES)}")
    draft = target if cfg.draft_dtype in ("auto", "same") else cfg.draft_dtype
    if draft == "int8" and device.type != "cpu":
        raise ModelLoadError("draft dtype int8 (dynamic quantisation) runs on the CPU only")
    return target, draft


def run_synthetic(cfg: SyntheticConfig, out_dir: str | os.PathLike | None = "bench-results", command: str = "",
                  log=None) -> dict:
    """Build the synthetic pair, check SD == AR, time the target's passes, run AR, SD and CSD on
    ``cfg.prompts`` random prompts and write ``results.json`` and ``results.md`` to ``out_dir``
    (None: write nothing). ``log``: a callable for progress lines (None: silent)."""
    from csd.models import resolve_device

    cfg.validated()
    device = resolve_device(cfg.device)
    name = cfg.pair if cfg.pair != "auto" else ("1.5b" if device.type == "cuda" else "tiny")
    threads = cfg.threads or (1 if name == "tiny" and device.type == "cpu" else None)
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(replace(cfg, pair=name), device, out_dir, command, log)
    finally:
        torch.set_num_threads(before)


def _run(cfg: SyntheticConfig, device: torch.device, out_dir, command: str, log) -> dict:
    """The benchmark in numbered steps: 1. build the random models; 2. check SD == AR in float32 and
    convert them to their representations; 3. time the target's passes; 4. run every method on every
    prompt; 5. count CUDA synchronisations; 6. write the figures."""
    from csd.decode import Decoder
    from csd.profile import measure

    say = log or (lambda _msg: None)
    target_repr, draft_repr = _reprs(cfg, device)
    d_arch, t_arch = (ARCHS[a] for a in PAIRS[cfg.pair])
    if d_arch["vocab_size"] != t_arch["vocab_size"]:
        raise ValueError("the draft and target architectures must share a vocabulary")
    if cfg.prompt_tokens + cfg.max_new_tokens > t_arch["max_position_embeddings"]:
        raise ValueError("--prompt-tokens + --max-new-tokens exceed the architecture's context")
    started, t_start = now(), time.perf_counter()
    prompts = _random_prompts(cfg.prompts, cfg.prompt_tokens, t_arch["vocab_size"], cfg.seed)

    say(f"building random {cfg.pair} models on {device} (seed {cfg.seed})")                      # 1.
    draft_model, target_model = build_model(d_arch, device, cfg.seed), build_model(t_arch, device, cfg.seed + 1)
    build_s = time.perf_counter() - t_start
    check = None
    if target_repr != "float32" and cfg.check_prompts > 0:                                       # 2.
        say("checking greedy SD == AR in float32")
        ref = make_pair(cfg.pair, draft_model, target_model, device, "float32", "float32", cfg.draft_impl)
        check = check_sd_equals_ar(ref, prompts[:cfg.check_prompts], min(cfg.check_tokens, cfg.max_new_tokens),
                                   _fixed_gamma(cfg), cfg.acceptance, _coin_seed(cfg, 0))
        del ref
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    pair = make_pair(cfg.pair, draft_model, target_model, device, target_repr, draft_repr, cfg.draft_impl)
    del draft_model, target_model
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    say(f"timing target passes of {', '.join(map(str, cfg.pass_lengths))} tokens")               # 3.
    costs = measure(pair, tuple(sorted(set(cfg.pass_lengths))), cfg.reps)
    table_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    decoder = Decoder(pair, costs=costs)
    records = bench_prompts(pair, decoder, cfg, prompts, say)                                    # 4.
    syncs = cuda_syncs(pair, decoder, cfg, prompts[0], say) if device.type == "cuda" else {}       # 5.

    if check is None:             # the timed runs are float32: they are the check                  6.
        sd = [r for r in records if r.method == "sd"]
        check = {"dtype": target_repr, "prompts": len(sd), "tokens": cfg.max_new_tokens, "gamma": _fixed_gamma(cfg),
                 "identical": sum(bool(r.identical_to_ar) for r in sd), "source": "the timed runs",
                 "passed": all(r.identical_to_ar for r in sd) if target_repr == "float32" else None}
    results = _results(cfg, pair, records, costs, check, syncs, _peak_memory(device, records, table_peak),
                       {"command": command, "started_at": started, "build_s": build_s,
                        "wall_s": time.perf_counter() - t_start, "target_repr": target_repr, "draft_repr": draft_repr})
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "results.json", results)
        (out / "results.md").write_text(render_markdown(results), encoding="utf-8")
    return results


def _fixed_gamma(cfg: SyntheticConfig) -> int:
    return cfg.gamma if cfg.gamma != "auto" else 6


def _coin_seed(cfg: SyntheticConfig, k: int) -> int:
    return cfg.seed * 1_000_003 + k


def bench_prompts(pair, decoder, cfg: SyntheticConfig, prompts: list[list[int]], say) -> list[Measured]:
    """Warm up, then per prompt: AR first (its run writes the script), then SD and CSD, taking
    turns going first, each until it follows its script."""
    base = CSDConfig(method="ar", gamma=cfg.gamma, gamma_max=cfg.gamma_max, lam=cfg.lam, tau=cfg.tau,
                     max_new_tokens=cfg.max_new_tokens)
    configs = {m: replace(base, method=m) for m in METHODS}
    start_memory = decoder.default_memory()                       # empty: nothing is known about random models
    memory = start_memory.copy()
    room = cfg.prompt_tokens + cfg.max_new_tokens + 64
    if cfg.warmup:
        say("warm-up")
        warm = _random_prompts(1, cfg.prompt_tokens, pair.draft_vocab_size, cfg.seed + 99)[0]
        # at full length: on the H200 an 8-token warm-up left the first prompt's AR run 3x slower than
        # the next ones (the allocator and the kernels meet each longer cache for the first time)
        ar, _, _ = _timed(pair, decoder, warm, configs["ar"], None)
        for m in METHODS[1:]:
            scripted_run(pair, decoder, warm, configs[m], start_memory.copy(),
                         _script_of(warm, ar), _coins(room, cfg.acceptance, cfg.seed + 99), 0)
    records: list[Measured] = []
    for k, prompt in enumerate(prompts):
        say(f"prompt {k + 1}/{len(prompts)}")
        run, wall, peak = _timed(pair, decoder, prompt, configs["ar"], None)
        wall = _fastest(pair, decoder, prompt, configs["ar"], None, run, wall, cfg.repeats)
        ar = _measured("ar", k, run, wall, peak)
        ar.identical_to_ar = True
        records.append(ar)
        script = _script_of(prompt, run)
        coins = _coins(room, cfg.acceptance, _coin_seed(cfg, k))
        for m in (METHODS[1:] if k % 2 == 0 else METHODS[:0:-1]):
            online = m == "csd" and cfg.memory_mode == "online"
            run, wall, peak, mem_after, attempts, fixed, own = scripted_run(
                pair, decoder, prompt, configs[m], memory if online else start_memory.copy(), script, coins,
                cfg.rehearsals, cfg.repeats)
            if online:
                memory = mem_after
            r = _measured(m, k, run, wall, peak)
            r.attempts, r.fixed_point, r.identical_to_ar = attempts, fixed, run.token_ids == ar.token_ids
            records.append(r)
            if fixed:
                script = own                                # the next method starts from a known fixed point
    pair.draft_lm.script(None)
    return records


def cuda_syncs(pair, decoder, cfg: SyntheticConfig, prompt: list[int], say) -> dict:
    """Per method, one untimed run on ``prompt`` under torch's sync debug mode."""
    from csd.memory import CorrectionMemory

    say("counting CUDA synchronisations")
    base = CSDConfig(method="ar", gamma=cfg.gamma, gamma_max=cfg.gamma_max, lam=cfg.lam, tau=cfg.tau,
                     max_new_tokens=cfg.max_new_tokens)
    ar, _, _ = _timed(pair, decoder, prompt, base, None)
    pair.draft_lm.script(*_script_of(prompt, ar), _coins(len(prompt) + cfg.max_new_tokens + 64, cfg.acceptance,
                                                         _coin_seed(cfg, 0)))
    out = {}
    for m in METHODS:
        holder = {}

        def go(m=m, holder=holder):
            holder["run"] = run = decoder.run(prompt, replace(base, method=m), CorrectionMemory(pair.pair_id))
            for _ in run:
                pass
        try:
            n = count_cuda_syncs(go)
            mt = holder["run"].metrics
            out[m] = {"cuda_syncs": n, "target_passes": mt.target_forwards,
                      "cuda_syncs_per_block": n / mt.target_forwards, "engine_host_syncs": mt.host_syncs}
        except Exception as e:       # a diagnostic: never lose the benchmark to it
            out[m] = {"error": f"{type(e).__name__}: {e}"}
    pair.draft_lm.script(None)
    return out


def _peak_memory(device: torch.device, records: list[Measured], table_peak: int | None) -> dict:
    if device.type == "cuda":
        peak = {"kind": "cuda max_memory_allocated",
                "bytes": max([table_peak or 0] + [r.peak_bytes or 0 for r in records])}
    else:
        peak = {"kind": "cpu peak RSS (ru_maxrss of this process)",
                "bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    return {**peak, "mib": peak["bytes"] / 2**20}


def _results(cfg: SyntheticConfig, pair, records: list[Measured], costs, check: dict, syncs: dict, peak: dict,
             run_meta: dict) -> dict:
    import transformers

    from csd.profile import machine_name

    d_name, t_name = PAIRS[cfg.pair]
    ar = [r for r in records if r.method == "ar"]
    return {
        "kind": "synthetic", "status": "finished",
        "meta": {**{k: run_meta[k] for k in ("command", "started_at", "build_s", "wall_s")},
                 "finished_at": now(),
                 "machine": {"name": machine_name(pair.device), "device": str(pair.device),
                             "platform": platform.platform(), "cpu_count": os.cpu_count(),
                             "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                             "torch": torch.__version__, "transformers": transformers.__version__},
                 "config": {**asdict(cfg), "target_repr": run_meta["target_repr"], "draft_repr": run_meta["draft_repr"]},
                 "archs": {"draft": {"name": d_name, **ARCHS[d_name]}, "target": {"name": t_name, **ARCHS[t_name]}},
                 "init": {"scheme": "fan-in: std 1/sqrt(fan_in); embeddings std 1; q, k: attention logits of std "
                                    f"{ATTN_LOGIT_STD}; lm_head: logits of std {LOGIT_STD}; norms 1, biases 0",
                          "draft_seed": cfg.seed, "target_seed": cfg.seed + 1},
                 "models": pair.describe()},
        "summary": {f"synthetic-{cfg.pair}": {m: summarize([r for r in records if r.method == m], ar)
                                              for m in METHODS}},
        "verify_ms": {str(k): v for k, v in sorted(costs.verify_ms.items())},
        "draft_ms": costs.draft_ms,
        "bound": {str(g): costs.bound(g) for g in sorted({1, 2, 4, 6, 8} | {_fixed_gamma(cfg)})},
        "sd_equals_ar": check,
        "syncs": syncs,
        "peak_memory": peak,
        "outputs": output_stats([r.token_ids for r in ar]),
        "items": [{k: v for k, v in asdict(r).items() if k != "token_ids"} for r in records],
    }


# -- figures ------------------------------------------------------------------------------------------
def summarize(rs: list[Measured], ar: list[Measured]) -> dict:
    """One method over the prompts. Key names follow ``bench.harness`` where the meaning is the same."""
    wall, tokens = sum(r.wall_s for r in rs), sum(r.new_tokens for r in rs)
    passes, drafted, decided = sum(r.target_passes for r in rs), sum(r.drafted for r in rs), sum(r.decided for r in rs)
    kept = sum(r.accepted + r.rescued for r in rs)
    ar_wall = sum(r.wall_s for r in ar)
    peaks = [r.peak_bytes for r in rs if r.peak_bytes is not None]
    return {
        "n": len(rs), "new_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else None,
        "speedup_wall": ar_wall / wall if wall > 0 and ar else None,
        "target_passes": passes, "mean_accepted_length": tokens / passes if passes else None,
        "draft_passes": sum(r.draft_passes for r in rs), "drafted": drafted, "decided": decided,
        "accepted": sum(r.accepted for r in rs), "rescued": sum(r.rescued for r in rs),
        "acceptance": kept / decided if decided else None,
        "acceptance_rate": kept / drafted if drafted else None,
        "host_syncs": sum(r.host_syncs for r in rs), "syncs_per_block": sum(r.host_syncs for r in rs) / passes
        if passes else None,
        "draft_s": sum(r.draft_s for r in rs), "verify_s": sum(r.verify_s for r in rs),
        "bookkeeping_share": sum(r.bookkeeping_s for r in rs) / wall if wall > 0 else None,
        "identical_to_ar": sum(bool(r.identical_to_ar) for r in rs),
        "fixed_point": sum(r.fixed_point for r in rs), "attempts": sum(r.attempts for r in rs),
        "peak_memory_bytes": max(peaks) if peaks else None,
    }


def output_stats(outputs: list[list[int]]) -> dict:
    """Is the target's greedy output degenerate? Distinct-token share and the longest run of one token."""
    def longest(t):
        best = run = 1 if t else 0
        for a, b in zip(t, t[1:]):
            run = run + 1 if a == b else 1
            best = max(best, run)
        return best
    shares = [len(set(t)) / len(t) for t in outputs if t]
    return {"distinct_share": sum(shares) / len(shares) if shares else None,
            "longest_run": max((longest(t) for t in outputs), default=0), "sample": outputs[0][:24] if outputs else []}


def render_markdown(res: dict) -> str:
    meta, cfg = res["meta"], res["meta"]["config"]
    (dataset, stats), = res["summary"].items()
    models = meta["models"]
    lines = [f"## Synthetic benchmark `{dataset}` (random weights) on {meta['machine']['name']}", "",
             f"draft {models['draft']} ({models['draft_impl']}, {models['draft_repr']}) -> target {models['target']} "
             f"({models['target_repr']}); torch {meta['machine']['torch']}, {meta['machine']['torch_threads']} threads; "
             f"{cfg['prompts']} prompts of {cfg['prompt_tokens']} tokens x {cfg['max_new_tokens']} new tokens; "
             f"gamma {cfg['gamma']}; requested acceptance {cfg['acceptance']:.2f}", "",
             "| method | tokens/s | vs AR | target passes | tokens/pass | acceptance | kept/drafted | rescued "
             "| syncs/block | fixed point | peak memory (MiB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m, s in stats.items():
        peak = s["peak_memory_bytes"] / 2**20 if s["peak_memory_bytes"] else res["peak_memory"]["mib"]
        lines.append(f"| {m} | {fmt(s['tokens_per_s'], '.1f', none='-')} | {fmt(s['speedup_wall'], none='-')}x | {s['target_passes']} "
                     f"| {fmt(s['mean_accepted_length'], none='-')} | {fmt(s['acceptance'], none='-')} | {fmt(s['acceptance_rate'], none='-')} "
                     f"| {s['rescued'] if m != 'ar' else '-'} | {fmt(s['syncs_per_block'], none='-')} "
                     f"| {s['fixed_point']}/{s['n']} | {peak:.0f} |")
    ks = list(res["verify_ms"])
    lines += ["", "Target pass time by tokens per pass (a block of gamma draft tokens is a pass of gamma + 1):", "",
              "| tokens | " + " | ".join(ks) + " |", "|---|" + "---:|" * len(ks),
              "| ms | " + " | ".join(f"{res['verify_ms'][k]:.2f}" for k in ks) + " |", "",
              f"Draft: {res['draft_ms']:.2f} ms per token. Ideal speed-up bound (every draft accepted): "
              + ", ".join(f"gamma {g}: {b:.2f}x" for g, b in res["bound"].items()) + ".", ""]
    c = res["sd_equals_ar"]
    verdict = {True: "PASSED", False: "FAILED", None: "not an exact representation"}[c["passed"]]
    lines.append(f"Greedy SD == AR ({c['dtype']}, {c.get('source', 'separate check')}): {c['identical']}/{c['prompts']} "
                 f"prompts identical over {c['tokens']} tokens: {verdict}.")
    for m, s in res.get("syncs", {}).items():
        if "error" in s:
            lines.append(f"CUDA syncs ({m}): not counted ({s['error']}).")
        else:
            lines.append(f"CUDA synchronising calls ({m}, torch sync debug mode): {s['cuda_syncs']} over "
                         f"{s['target_passes']} target passes = {s['cuda_syncs_per_block']:.2f} per block "
                         f"(engine's own count: {s['engine_host_syncs']}).")
    misses = {m: s["n"] - s["fixed_point"] for m, s in stats.items() if s["fixed_point"] < s["n"]}
    if misses:
        lines.append(f"WARNING: {', '.join(f'{m} on {k} prompt(s)' for m, k in misses.items())} did not follow its script "
                     f"after {cfg['rehearsals']} reruns: acceptance there is below the requested one (in "
                     f"{models['target_repr']} the target's top-1 changed with the composition of its verify pass).")
    o = res["outputs"]
    lines += [f"Peak memory: {res['peak_memory']['mib']:.0f} MiB ({res['peak_memory']['kind']}). Target outputs: "
              f"{fmt(o['distinct_share'], none='-')} distinct-token share, longest run of one token {o['longest_run']}.", ""]
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------------
def add_synthetic_args(p: argparse.ArgumentParser) -> None:
    """The options of the synthetic benchmark proper (``csd bench`` has the shared ones)."""
    g = p.add_argument_group("synthetic benchmark (random weights, real architectures: no model files needed)")
    g.add_argument("--synthetic", action="store_true",
                   help="benchmark AR, SD and CSD on randomly initialised models with the real pair's architectures")
    g.add_argument("--synthetic-config", default="auto", choices=PAIR_CHOICES,
                   help="tiny (CPU, seconds), 1.5b (the embedded pair's 0.5B/1.5B), 7b (0.5B draft, Qwen2.5-7B "
                        "target); auto: 1.5b on CUDA, tiny on the CPU")
    g.add_argument("--acceptance", type=float, default=SyntheticConfig.acceptance,
                   help="probability that the draft proposes the target's own next token (default 0.8)")
    g.add_argument("--prompt-tokens", type=int, default=SyntheticConfig.prompt_tokens,
                   help="random prompt length in tokens (default 32)")
    g.add_argument("--pass-lengths", default=",".join(map(str, PASS_LENGTHS)),
                   help="target pass lengths (tokens) of the verify-time table, comma-separated")
    g.add_argument("--rehearsals", type=int, default=SyntheticConfig.rehearsals,
                   help="untimed reruns allowed per method and prompt to reach the script's fixed point (default 16)")
    g.add_argument("--repeats", type=int, default=SyntheticConfig.repeats,
                   help="timed runs of each method's counted run; the fastest counts (default 1; 3 on a GPU, whose "
                        "clocks follow the load)")


def config_from_args(args) -> SyntheticConfig:
    try:
        lengths = tuple(int(x) for x in str(args.pass_lengths).split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--pass-lengths must be comma-separated whole numbers, got {args.pass_lengths!r}") from None
    return SyntheticConfig(
        pair=args.synthetic_config, acceptance=args.acceptance, prompts=args.limit, prompt_tokens=args.prompt_tokens,
        max_new_tokens=args.max_new_tokens, gamma=args.gamma, gamma_max=args.gamma_max, lam=args.lam, tau=args.tau,
        memory_mode=getattr(args, "memory_mode", "online"), seed=args.seed, device=args.device, dtype=args.dtype,
        draft_dtype=args.draft_dtype, draft_impl=args.draft_impl, pass_lengths=lengths,
        warmup=not args.no_warmup, rehearsals=args.rehearsals, repeats=args.repeats).validated()


def run_from_args(args, command: str = "") -> int:
    """Run, print the Markdown table (progress on stderr); 0 when greedy SD == AR held (or was not checkable)."""
    cfg = config_from_args(args)
    res = run_synthetic(cfg, args.out, command or command_line("bench.synthetic"),
                        log=lambda msg: print(f"synthetic: {msg}", file=sys.stderr, flush=True))
    print((Path(args.out) / "results.md").read_text(encoding="utf-8"))
    print(f"results: {Path(args.out).resolve()}", file=sys.stderr)
    return 1 if res["sd_equals_ar"]["passed"] is False else 0


def build_parser() -> argparse.ArgumentParser:
    """``python -m bench.synthetic``: the same options as ``csd bench --synthetic``, for a machine
    that has torch and transformers but not the store's or the app's packages."""
    d = SyntheticConfig()
    p = argparse.ArgumentParser(prog="python -m bench.synthetic", description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=d.prompts, help="random prompts (default 10)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--out", default="bench-results", help="output directory (default: bench-results)")
    p.add_argument("--seed", type=int, default=d.seed, help="weights, prompts and coins (default 0)")
    p.add_argument("--gamma", type=parse_gamma, default=d.gamma, help="draft block length, or auto (default 6)")
    p.add_argument("--gamma-max", type=int, default=d.gamma_max)
    p.add_argument("--lam", type=float, default=d.lam)
    p.add_argument("--tau", type=float, default=d.tau)
    p.add_argument("--memory-mode", choices=("online", "fresh"), default=d.memory_mode)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--device", default=d.device, help="auto (CUDA if available), cpu, cuda, cuda:1 ...")
    p.add_argument("--dtype", default=d.dtype, choices=("auto", "float32", "bfloat16", "float16", "int8"),
                   help="the target's representation (auto: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--draft-dtype", default=d.draft_dtype,
                   choices=("auto", "same", "float32", "bfloat16", "float16", "int8"))
    p.add_argument("--draft-impl", default=d.draft_impl, choices=("auto", "hf", "lean"))
    add_synthetic_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from csd.config import ConfigError
    from csd.models import ModelLoadError

    args = build_parser().parse_args(argv)
    try:
        return run_from_args(args)
    except (ConfigError, ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
