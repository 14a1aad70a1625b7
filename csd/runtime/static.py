"""The static decode path (how and why: docs/gpu.md): ``StaticLM`` runs a ``LeanLM``'s weights at fixed shapes, so
that on a GPU each pass replays a captured CUDA graph instead of launching kernels from Python: one KV cache of a
fixed ``capacity`` per model, attention under a mask over the smallest of a few ``attention_spans`` that holds the
pass; one graph per (pass length, rows kept, span), other shapes eager; ``compiled`` puts the pass through
``torch.compile`` first. Greedy output equals the eager path's up to float rounding (``tests/test_static.py``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from .lm import LM, PER_QUERY_MAX, LeanLM, ids_tensor

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 4096     # tokens of prompt + answer + one block (7B in bf16: 57 KB a token, 0.23 GB)
FIRST_SPAN, SPAN_GROWTH = 256, 4   # attention spans 256, 1024, 4096, ...: graphs per shape, the longest read
ENGINES = ("auto", "eager", "static", "compiled")
STATIC_ENGINES = ("static", "compiled")       # the engines that run ``StaticLM``


class CapacityError(ValueError):
    """A request the static KV cache cannot hold."""


class CompileError(RuntimeError):
    """``torch.compile`` failed on this machine (no compiler, no Triton, an unsupported op)."""


class StaticCache:
    """A run's handle on its model's one KV cache: the tokens it holds (``n``), and which run owns it."""

    def __init__(self, owner: int):
        self.owner, self.n = owner, 0


def attention_spans(capacity: int) -> list[int]:
    """The key lengths a pass may attend over: ``FIRST_SPAN`` growing by ``SPAN_GROWTH``, then the capacity."""
    spans, s = [], FIRST_SPAN
    while s < capacity:
        spans.append(s)
        s *= SPAN_GROWTH
    return spans + [capacity]


def draft_shapes() -> list[tuple[int, int]]:
    """The draft's passes: one token, or two after a fully kept block (with the bonus), one row kept."""
    return [(1, 1), (2, 1)]


def target_shapes(longest: int) -> list[tuple[int, int]]:
    """The verify passes: the target's unseen token plus up to ``longest - 1`` proposals, every row kept."""
    return [(t, t) for t in range(1, longest + 1)]


class StaticLM(LM):
    """``lean``'s function at fixed shapes, one run at a time (``new_cache`` hands the one cache to a new
    run; a stale handle is refused). ``capacity``: tokens the cache holds."""

    def __init__(self, lean: LeanLM, capacity: int = DEFAULT_CAPACITY, compiled: bool = False):
        if capacity < 2:
            raise ValueError(f"a static KV cache needs room for at least 2 tokens, got {capacity}")
        self.lean, self.capacity = lean, int(capacity)
        self.impl = "compiled" if compiled else "static"
        if compiled:
            self._blocks = _compiled(self._blocks)
        self.vocab_ids = lean.vocab_ids
        dev = lean.device
        self._kv = lean.new_cache(self.capacity)
        self._pos = torch.zeros(1, dtype=torch.long, device=dev)       # the pass's first position
        self._keys = torch.arange(self.capacity, device=dev)            # key positions; query offsets
        half = lean.head_dim // 2
        self._sign = torch.cat([torch.full((half,), -1.0), torch.ones(half)]).to(dev, lean.dtype)   # (D,)
        self._bias = torch.tensor([float("-inf"), 0.0], device=dev, dtype=lean.dtype)   # masked, visible
        self._owner = 0
        self.spans = attention_spans(self.capacity)
        self.graphs: dict[tuple, tuple] = {}     # (T, keep, span), or ("block", feed, gamma, span, adjusted)
        self._pool = None                         # the graphs' one memory pool (CUDA)
        self._failed: set[tuple] = set()          # draft blocks whose capture failed: eager steps
        self.replays = self.eager_passes = self.block_replays = 0
        self.capture_s = 0.0

    @property
    def device(self) -> torch.device:
        return self.lean.device

    @property
    def vocab_size(self) -> int:
        return self.lean.vocab_size

    def new_cache(self) -> StaticCache:
        self._owner += 1
        return StaticCache(self._owner)

    def _check_owner(self, cache: StaticCache) -> None:
        if cache.owner != self._owner:
            raise RuntimeError("this model's static KV cache was handed to a newer run: the static path serves "
                               "one run at a time per model")

    def check_room(self, tokens: int, what: str = "this request") -> None:
        """Refuse, before any pass, a run that would hold more than the cache's capacity."""
        if tokens > self.capacity:
            raise CapacityError(f"{what} needs {tokens} positions of the static KV cache, which holds "
                                f"{self.capacity}; shorten the prompt, lower max_new_tokens or gamma, or load the "
                                f"pair with a larger --static-capacity")

    def span(self, end: int) -> int:
        """The attention span of a pass whose last position is ``end - 1``."""
        return next(s for s in self.spans if s >= end)

    @torch.inference_mode()
    def _step(self, ids: torch.Tensor, keep: int, span: int | None = None) -> torch.Tensor:
        """The pass at the position in ``self._pos``: fixed shapes for a given (T, keep, span)."""
        return self.lean.logits(self._blocks(ids, span or self.capacity), keep)

    def _blocks(self, ids: torch.Tensor, span: int) -> torch.Tensor:
        """The decoder blocks' output (1, T, hidden) for ``ids`` at ``self._pos``, attending over the cache's
        first ``span`` positions: what ``compiled`` compiles."""
        lean, t = self.lean, ids.numel()
        pos = self._pos + self._keys[:t]                                                 # (T,) on the device
        x = lean.embed[ids][None]                                                       # (1, T, hidden)
        cos, sin = lean._rope(pos)
        sin = sin * self._sign               # rotate_half's sign folded into sin: RoPE in three ops (_rotate)
        k, v = self._kv.k[:, :, :span], self._kv.v[:, :, :span]         # views: the writes land in the cache
        n_kv, group = lean.n_kv, lean.n_heads // lean.n_kv
        # the query heads sharing a key/value head are folded into the query length, (1, KV, G*T, D): SDPA's
        # enable_gqa with a mask would copy K and V out to every query head on CUDA (docs/gpu.md)

        def write(li, kk, vv):
            k[li].index_copy_(1, pos, kk)          # pos < span: within the view
            v[li].index_copy_(1, pos, vv)

        # exact int8: each query attends as a 1-token step would; additive masks made once a pass
        per_query = lean.per_row and 1 < t <= PER_QUERY_MAX
        bias = torch.where(self._keys[None, :span] <= pos[:, None], self._bias[1], self._bias[0])   # (T, span): 0, -inf
        folded_masks = ([bias[i:i + 1].repeat(group, 1) for i in range(t)] if per_query
                        else [bias.repeat(group, 1)])                                   # (G*n, span) each

        def folded(li, q, m):
            """q (1, H, n, D) under the folded mask rows m (G*n, span) -> (1, H, n, D)."""
            n, d = q.shape[2], q.shape[3]
            out = F.scaled_dot_product_attention(q.reshape(1, n_kv, group * n, d), k[li:li + 1], v[li:li + 1],
                                                 attn_mask=m, scale=lean.scaling)
            return out.reshape(1, n_kv * group, n, d)          # (a transposed layout on some kernels)

        def attend(li, q):
            if per_query:
                return torch.cat([folded(li, q[:, :, i:i + 1], m) for i, m in enumerate(folded_masks)], 2)
            return folded(li, q, folded_masks[0])

        return lean.layers_over(x, cos, sin, write, attend, _rotate)

    def forward(self, cache: StaticCache, ids: list[int] | torch.Tensor, keep: int) -> torch.Tensor:
        self._check_owner(cache)
        ids = ids_tensor(ids, self.device)
        t, start = ids.numel(), cache.n
        self.check_room(start + t, "this pass")
        self._pos.fill_(start)                   # a scalar fill: queued, no host sync
        span = self.span(start + t)
        graph = self.graphs.get((t, keep, span))
        if graph is not None:
            g, ids_in, out = graph
            with torch.inference_mode():
                ids_in.copy_(ids)
            g.replay()
            logits = out.clone()                 # the graph's output buffer is rewritten by its next replay
            self.replays += 1
        else:
            logits = self._step(ids, keep, span)
            self.eager_passes += 1
        cache.n = start + t
        return logits

    def draft_block(self, cache: StaticCache, feed: list[int] | torch.Tensor, g: int,
                    adjust: Callable | None = None) -> torch.Tensor:
        """g greedy draft steps on the device, the first after feeding ``feed``, each argmax feeding the next: the
        proposed ids (g,). On CUDA the block is one graph, captured on its first use per (feed length, g, span): the
        capture's two warm-up runs compute the block itself (the same keys and values at the same positions), so it
        may happen mid-run. ``adjust(logits (1, V), first position (1,), ids)``: a change of each step's logits that
        reads only device tensors of fixed addresses (the benchmark's scripted draft)."""
        self._check_owner(cache)
        ids = ids_tensor(feed, self.device)
        t, start = ids.numel(), cache.n
        if g < 1:
            raise ValueError(f"a draft block drafts at least one token, got {g}")
        end = start + t + g - 1                     # the last proposal is not fed: its key is not written
        self.check_room(end, "this draft block")
        span = self.span(end)
        key = ("block", t, g, span, adjust is not None)
        self._pos.fill_(start)
        graph = self.graphs.get(key)
        if graph is None and self.device.type == "cuda" and key not in self._failed:
            graph = self._capture_block(key, ids, start, adjust)
        if graph is not None:
            gr, ids_in, out = graph
            with torch.inference_mode():
                ids_in.copy_(ids)
            self._pos.fill_(start)
            gr.replay()
            xs = out.clone()
            self.block_replays += 1
        else:
            xs = self._draft_steps(ids, g, span, adjust)
            self.eager_passes += g
        cache.n = end
        return xs

    @torch.inference_mode()
    def _draft_steps(self, ids: torch.Tensor, g: int, span: int, adjust: Callable | None) -> torch.Tensor:
        """The block from ``self._pos``: fixed shapes for a given (len(ids), g, span)."""
        xs, x = [], ids
        for _ in range(g):
            logits = self.lean.logits(self._blocks(x, span), 1)                         # (1, V)
            if adjust is not None:
                logits = adjust(logits, self._pos, x)
            self._pos.add_(x.numel())                # the next step's first position, on the device
            tok = logits[-1].argmax()
            if self.vocab_ids is not None:
                tok = self.vocab_ids[tok]
            xs.append(tok)
            x = tok.view(1)
        return torch.stack(xs)                                                           # (g,)

    def _capture_block(self, key: tuple, ids: torch.Tensor, start: int, adjust: Callable | None):
        """Capture the block of ``key`` at the run's own position (its warm-ups compute the block itself);
        a capture that fails leaves the block to the eager steps, with a warning, once."""
        _, t, g, span, _ = key
        self.captures += 1
        try:
            with torch.inference_mode():
                ids_in = ids.clone()
            gr, out = self._record(lambda: self._draft_steps(ids_in, g, span, adjust), lambda: self._pos.fill_(start))
        except Exception as e:        # noqa: BLE001 - any capture failure: the eager steps compute the same
            log.warning("draft block graph (feed %d, gamma %d, span %d) not captured, drafting step by step: %s",
                        t, g, span, e)
            self._failed.add(key)
            return None
        self.graphs[key] = (gr, ids_in, out)
        return self.graphs[key]

    def _record(self, run: Callable[[], torch.Tensor], reset: Callable[[], object]):
        """(graph, its output buffer): ``run`` twice on a side stream (allocator, kernel choice), then captured into
        the model's one memory pool; ``reset`` sets the position before each, outside the graph."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                reset()
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        reset()
        self._pool = self._pool or torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            out = run()
        return graph, out

    def capture(self, shapes: Iterable[tuple[int, int]], progress: Callable[[str, float], None] | None = None,
                name: str = "model") -> None:
        """Record one CUDA graph per (pass length, rows kept) and attention span that can hold it, the
        longest first, in one memory pool. Call before any run: the warm-up passes write into the cache."""
        if self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; elsewhere the static path runs eagerly")
        shapes = sorted(set(shapes), reverse=True)
        self.check_room(max((t for t, _ in shapes), default=0), "a captured pass")
        shapes = sorted(((t, keep, s) for t, keep in shapes for s in self.spans if s >= t), reverse=True,
                        key=lambda x: (x[2], x[0]))
        t0 = time.perf_counter()
        for i, (t, keep, span) in enumerate(shapes):
            if progress:
                progress(f"{'compiling and ' * (self.impl == 'compiled')}capturing CUDA graphs: {name}, pass of {t} "
                         f"over {span}", i / len(shapes))
            with torch.inference_mode():           # as the decode loop's ids (a compiled pass checks)
                ids_in = torch.zeros(t, dtype=torch.long, device=self.device)
            g, out = self._record(lambda ids_in=ids_in, keep=keep, span=span: self._step(ids_in, keep, span),
                                  self._pos.zero_)
            self.graphs[(t, keep, span)] = (g, ids_in, out)
        torch.cuda.synchronize()
        self.capture_s += time.perf_counter() - t0
        log.info("%s: %d CUDA graphs captured in %.1f s", name, len(shapes), self.capture_s)

    def describe(self) -> dict:
        return {"engine": self.impl, "capacity": self.capacity, "graphs": len(self.graphs),
                "capture_s": round(self.capture_s, 2),
                "replays": self.replays, "block_replays": self.block_replays, "eager_passes": self.eager_passes}


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE as ``LeanLM._rotate`` computes it, with rotate_half's sign in ``signed_sin``: x * cos +
    [x2, x1] * [-sin, sin] in one ``addcmul`` (three kernels where ``_rotate`` launches five)."""
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat((x[..., half:], x[..., :half]), -1), signed_sin)


def _compiled(blocks: Callable[[torch.Tensor, int], torch.Tensor]) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """``blocks`` through ``torch.compile``, the pass length its one symbolic size (two compiles a span: one
    token, several). Call it in inference mode on inference tensors only, or it compiles again."""
    fn = torch.compile(blocks)

    def run(ids: torch.Tensor, span: int) -> torch.Tensor:
        if ids.shape[0] > 1:
            torch._dynamo.mark_dynamic(ids, 0)
        return fn(ids, span)
    return run


def make_static(lean: LeanLM, capacity: int, shapes: Iterable[tuple[int, int]], progress=None,
                name: str = "model", compiled: bool = False) -> StaticLM:
    """A ``StaticLM`` over ``lean``, its graphs captured where the device has them (CUDA)."""
    lm = StaticLM(lean, capacity, compiled)
    try:
        if lm.device.type == "cuda":
            lm.capture(shapes, progress, name)           # compiles too, in its warm-up passes
        elif compiled:             # no graphs here: compile both classes now (1 token, several), not in a request
            t0 = time.perf_counter()
            todo = [(t, span) for span in lm.spans for t in (1, 2)]
            for i, (t, span) in enumerate(todo):
                if progress:
                    progress(f"compiling the static pass: {name}, pass of {t} over {span}", i / len(todo))
                with torch.inference_mode():       # as the decode loop calls it (the compiled code checks)
                    lm._step(torch.zeros(t, dtype=torch.long, device=lm.device), 1, span)
            lm.capture_s = time.perf_counter() - t0
    except (torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as e:
        if not compiled:
            raise
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise CompileError(f"torch.compile could not compile the {name}'s pass on this machine ({type(e).__name__}: "
                           f"{first}); use --engine static") from e
    return lm
