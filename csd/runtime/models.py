"""Model loading: the embedded Qwen2.5-Coder 0.5B/1.5B pair, or any Hugging Face pair. ``load_pair`` puts together,
as ``LoadOptions`` say, the runtime's modules into a ``ModelPair``; none of them imports this module."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..config import GAMMA_RANGE, CSDConfig
from ..events import Progress
from ..fileio import read_json
from ..representation import Representation
from . import kquant, profile, smoothing
from .convert import FORMAT, cached_lean, digest, load_maxima, maxima_for, shipped_maxima
from .lm import HFLM, LeanLM, lean_unsupported
from .ortlm import ORT_FORMAT, OrtLM, ort_missing
from .ovlm import OvLM, ov_missing
from .pair import EMBEDDED, EMBEDDED_PAIR_ID, ModelLoadError, ModelPair, encode_prompt, special_token_ids
from .quant import (
    CPU_DRAFT_REPRS,
    CPU_TARGET_REPRS,
    DTYPES,
    INT8_ACTIVATIONS,
    INT8_ACTIVATIONS_DEFAULT,
    RETIRED_DRAFT_REPRS,
    TARGET_REPRS,
    memory_gib,
    quantize_int8,
    release_memory,
    to_repr,
)
from .refs import ModelRef, out_of_memory, resolve  # noqa: F401 - out_of_memory: the loader's message
from .smoothing import calibration_prompt_ids
from .static import DEFAULT_CAPACITY, ENGINES, STATIC_ENGINES, CompileError, draft_shapes, make_static, target_shapes

log = logging.getLogger(__name__)

DEFAULT_PAIR = "embedded"
GGUF_DRAFTS = ("gguf", "q4_0")      # drafts on the k-quant kernel: the file's own blocks, or them at 4 bits
DRAFT_DTYPES = ("auto", "same", "float32", "bfloat16", "float16", "int8", "int4", "ort4", "gguf", "q4_0")
DRAFT_IMPLS = TARGET_IMPLS = ("auto", "hf", "lean")
DRAFT_VOCAB_FILE = Path(__file__).parent.parent / "data" / "draft_vocab.json.gz"


def resolve_device(device: str | None = None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_repr(name: str | torch.dtype, device: torch.device) -> str:
    """A target representation's name, refused with a clear message where it cannot run."""
    if isinstance(name, torch.dtype):
        name = str(name).removeprefix("torch.")
    if name not in TARGET_REPRS:
        raise ModelLoadError(f"unknown dtype {name!r}; choose auto, {', '.join(TARGET_REPRS)}")
    if name in CPU_TARGET_REPRS and device.type != "cpu":
        raise ModelLoadError(f"{name} runs on the CPU only; choose bfloat16 or float16 on a GPU")
    if name == "ov4" and ov_missing():
        raise ModelLoadError(f"--dtype ov4 cannot run here: {ov_missing()}; choose int8")
    return name


def context_limit(config) -> int:
    """The longest sequence a model's config allows (2048 where it does not say)."""
    return int(getattr(config, "max_position_embeddings", 0) or 2048)


def compare_tokenizers(a, b) -> str | None:
    """None if two tokenizers map text to ids identically, else a message naming the difference."""
    va, vb = a.get_vocab(), b.get_vocab()
    if len(va) != len(vb):
        return f"vocabulary sizes differ: draft {len(va)} tokens, target {len(vb)} tokens"
    if va != vb:
        for tok_, i in sorted(va.items(), key=lambda kv: kv[1]):
            if vb.get(tok_) != i:
                return f"token {tok_!r} has id {i} in the draft's vocabulary and {vb.get(tok_)} in the target's"
    for attr in ("eos_token_id", "bos_token_id"):
        if getattr(a, attr, None) != getattr(b, attr, None):
            return f"{attr} differs: draft {getattr(a, attr, None)}, target {getattr(b, attr, None)}"
    return None


def shared_rows(draft_rows: int, target_rows: int, tokens: int) -> int | None:
    """None when the two output layers have the same rows; else the rows they share, where they differ
    only by padding past the tokenizer's tokens (Qwen2.5-0.5B and -7B); refused otherwise."""
    if draft_rows == target_rows:
        return None
    if min(draft_rows, target_rows) < tokens:
        raise ModelLoadError(f"draft and target output layers differ in size ({draft_rows} vs {target_rows} rows) "
                             f"and one lacks rows for the tokenizer's {tokens} tokens")
    return min(draft_rows, target_rows)


def draft_vocab_ids(pair_id: str, tokenizer, special_ids, vocab_size: int, choice: str | int) -> torch.Tensor | None:
    """The token ids the draft may propose, special ones always: None (all) or a reduced vocabulary.
    ``auto``: the embedded pair's shipped list, else all; ``full``; or N, the first N of that list."""
    if choice == "full":
        return None
    if not DRAFT_VOCAB_FILE.exists() or pair_id != EMBEDDED_PAIR_ID:
        if choice == "auto":
            return None
        raise ModelLoadError("a reduced draft vocabulary (--draft-vocab N) needs a token list; only the embedded "
                             "pair ships one")
    data = read_json(DRAFT_VOCAB_FILE)
    ids = [int(i) for i in data["ids"]]
    n = data.get("default", len(ids)) if choice == "auto" else int(choice)
    return torch.tensor(sorted(i for i in {*ids[:n], *special_ids} if i < vocab_size), dtype=torch.long)


SMOOTHED = f"SmoothQuant alpha {smoothing.ALPHA}"


@dataclass(frozen=True)
class LoadOptions:
    """How ``load_pair`` loads a pair: the model flags of the command line and the app (their help says
    more). "auto": int8 on the CPU, bfloat16/float16 and the static engine on CUDA, the lean path where it runs."""
    dtype: str | torch.dtype | None = "auto"
    device: str | torch.device | None = "auto"
    device_map: str | dict | None = None
    trust_remote_code: bool = False
    load_draft: bool = True
    draft_weights: str = "auto"
    draft_impl: str = "auto"
    draft_vocab: str | int = "auto"
    target_impl: str = "auto"
    int8_smoothing: bool = True
    activations: str = INT8_ACTIVATIONS_DEFAULT
    engine: str = "auto"
    static_capacity: int = DEFAULT_CAPACITY
    fallback: bool = False      # set by ``validated``: the engine is auto's choice, eager where it fails

    @property
    def static(self) -> bool:
        return self.engine in STATIC_ENGINES

    @property
    def act_dtype(self) -> torch.dtype:
        return torch.float32 if self.dtype in CPU_TARGET_REPRS else DTYPES[self.dtype]

    def validated(self) -> LoadOptions:
        """Checked before anything loads (ModelLoadError), with device, engine and dtypes resolved."""
        dev = resolve_device(self.device)
        if self.engine not in ENGINES:
            raise ModelLoadError(f"unknown engine {self.engine!r}; choose {', '.join(ENGINES)}")
        engine = auto_engine(dev, self.device_map) if self.engine == "auto" else self.engine
        if engine in STATIC_ENGINES and (self.device_map is not None or int(self.static_capacity) < 64):
            if self.device_map is None:
                raise ModelLoadError("the static engine runs on one device with a KV cache of at least 64 tokens")
            raise ModelLoadError("the static engine runs on one device (no --device-map)")
        if self.dtype in (None, "auto"):
            dtype = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if dev.type == "cuda" \
                else profile.chosen_target_dtype()
        else:
            dtype = check_repr(self.dtype, dev)
        for value, choices, what in ((self.draft_weights, DRAFT_DTYPES, "draft dtype"),
                                     (self.draft_impl, DRAFT_IMPLS, "draft implementation"),
                                     (self.target_impl, TARGET_IMPLS, "target implementation")):
            if value not in choices:
                raise ModelLoadError(f"unknown {what} {value!r}; choose {', '.join(choices)}")
        if not (self.draft_vocab in ("auto", "full")
                or (str(self.draft_vocab).isdigit() and int(self.draft_vocab) > 0)):
            raise ModelLoadError(f"--draft-vocab must be auto, full or a positive number, got {self.draft_vocab!r}")
        if self.activations not in INT8_ACTIVATIONS:
            raise ModelLoadError(f"int8 activations {self.activations!r}: choose {' or '.join(INT8_ACTIVATIONS)}")
        if self.draft_weights == "auto":
            draft_weights = profile.chosen_draft_weights() if dev.type == "cpu" else "same"
        else:
            draft_weights = RETIRED_DRAFT_REPRS.get(self.draft_weights, self.draft_weights)
        if draft_weights in CPU_DRAFT_REPRS and dev.type != "cpu":
            raise ModelLoadError(f"draft dtype {draft_weights} runs on the CPU only")
        return replace(self, device=dev, engine=engine, dtype=dtype, draft_weights=draft_weights,
                       fallback=self.fallback or self.engine == "auto")

    def for_target(self, name: str, config) -> LoadOptions:
        """With ``target_impl`` resolved for the target's config; ModelLoadError where it cannot run."""
        why = lean_unsupported(config) or (self.device_map is not None
                                           and "a device_map (the lean path runs on one device)")
        if self.target_impl == "lean" and why:
            raise ModelLoadError(f"--target-impl lean cannot run {name!r}: {why}")
        if self.static and why:
            raise ModelLoadError(f"the static engine cannot run {name!r}: {why} (use --engine eager)")
        impl = self.target_impl
        if impl == "auto":
            impl = "lean" if (self.dtype in CPU_TARGET_REPRS or self.static) and not why else "hf"
        if self.static and impl != "lean":
            raise ModelLoadError("the static engine runs the lean target path (not --target-impl hf)")
        if self.dtype in ("ov4", "gguf") and impl != "lean":
            raise ModelLoadError(f"{self.dtype} runs the lean target path, which cannot run {name!r}: {why}" if why
                                 else f"{self.dtype} runs the lean target path (not --target-impl hf)")
        if self.activations == "row" and self.dtype == "int8" and impl != "lean":
            raise ModelLoadError("int8 activations per row need the lean target path (not --target-impl hf)")
        activations = self.activations
        if activations == "auto":       # exact rows by default, where the lean path can run them
            activations = "row" if impl == "lean" else "pass"
        return replace(self, target_impl=impl, activations="pass" if impl != "lean" else activations)


@dataclass
class Loaded:
    """One model as loaded: its decode path, its transformers model (or the ``loader`` that builds it)."""
    lm: object = None
    model: torch.nn.Module | None = None
    loader: Callable[[], torch.nn.Module] | None = None
    repr: str = ""
    smoothing: str = ""


def load_pair(draft: str | None = DEFAULT_PAIR, target: str = DEFAULT_PAIR, *, options: LoadOptions | None = None,
              progress: Progress | None = None, check=None, draft_alone: bool = False, **fields) -> ModelPair:
    """Load a draft/target pair sharing one tokenizer (``draft=None``: AR only) as ``options`` (or ``LoadOptions``
    keywords) say. ``check(tokenizer, context_limit)`` runs before any model loads, raising to refuse a request.
    ``draft_alone``: the draft's ``Loaded`` only, the target's weights not read (``choose_draft_weights``)."""
    o = (options or LoadOptions(**fields)).validated()
    t_ref = resolve(target, "target", progress, o.trust_remote_code)
    d_ref = resolve(draft, "draft", progress, o.trust_remote_code) if draft is not None and o.load_draft else None
    tok = load_tokenizer(t_ref, d_ref, o.trust_remote_code)
    t_config = t_ref.config()
    if check is not None:
        check(tok, context_limit(t_config))
    o = o.for_target(t_ref.disp, t_config)
    eos_ids = end_tokens(tok, t_ref.path)
    special = special_token_ids(tok, eos_ids)
    embedded = t_ref.disp == EMBEDDED["target"].name and (d_ref is None or d_ref.disp == EMBEDDED["draft"].name)
    pair_id = EMBEDDED_PAIR_ID if embedded else f"{d_ref.disp if d_ref else None}->{t_ref.disp}"
    d = load_draft(d_ref, t_config, tok, (pair_id, special), o, progress) if d_ref is not None else Loaded()
    if draft_alone:
        return d
    t = load_target(t_ref, t_config, tok, o, progress)
    target_repr = t.repr or o.dtype         # gguf falls back to int8 where its kernel cannot run
    acts = ("row" if getattr(t.lm, "per_row", False) else "pass") if target_repr == "int8" else ""   # auto resolved
    release_memory()            # the float weights that quantising replaced
    if o.static:
        t.lm, d.lm = static_engine(t.lm, d.lm, d_ref, o, progress)
    mem = memory_gib(o.device)
    if progress:
        progress(f"models ready: {mem} GiB {'on the GPU' if o.device.type == 'cuda' else 'resident'}", 1.0)
    return ModelPair(d.model, t.model, tok, pair_id, d_ref.disp if d_ref else "", t_ref.disp,
                     t.lm.device if o.device_map is None else o.device, o.act_dtype, eos_ids,
                     context_limit(t_config), special_ids=special, target_lm=t.lm, draft_lm=d.lm,
                     rep=Representation(target_repr, d.repr, acts),
                     target_smoothing=t.smoothing, memory_gib=mem, target_loader=t.loader, draft_loader=d.loader)


def load_tokenizer(t_ref: ModelRef, d_ref: ModelRef | None, trust_remote_code: bool):
    """The target's tokenizer, refused where the draft's maps text to other ids."""
    from transformers import AutoTokenizer
    try:
        tok_t = AutoTokenizer.from_pretrained(t_ref.path, trust_remote_code=trust_remote_code)
        tok_d = None if d_ref is None or (d_ref.embedded and t_ref.embedded) else \
            AutoTokenizer.from_pretrained(d_ref.path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load tokenizer: {str(e).splitlines()[0]}") from None
    diff = tok_d is not None and compare_tokenizers(tok_d, tok_t)   # the shipped pair's files hold one tokenizer
    if diff:
        raise ModelLoadError(f"draft {d_ref.disp!r} and target {t_ref.disp!r} do not share a tokenizer: {diff}")
    return tok_t


def end_tokens(tok, path: str) -> tuple[int, ...]:
    """The ids that end an answer: the generation config's, and the tokenizer's own end token."""
    from transformers import GenerationConfig
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id or tok.eos_token_id
    except (OSError, ValueError):
        eos = tok.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    if tok.eos_token_id is not None and tok.eos_token_id not in eos_ids:
        eos_ids = eos_ids + (tok.eos_token_id,)
    return eos_ids


_kept_targets: dict[str, object] = {}     # a target's identity -> its LM on its GGUF blocks, for its next load


def keep_target_lm(target: str, lm) -> None:
    """Hand ``lm``, the target that ``target`` names as loaded on its GGUF blocks, to the next ``load_pair`` that
    loads that target on its blocks, once: a first start times the target, then loads it for the app, and the file's
    1 GB of blocks is read and repacked once instead of twice. One target is kept at a time."""
    _kept_targets.clear()
    _kept_targets[resolve(target, "target", None, False).identity()] = lm


def load_target(ref: ModelRef, config, tok, o: LoadOptions, progress: Progress | None) -> Loaded:
    """The target: on its GGUF file's own blocks, int8 lean mapped from the cache, else the float model (quantised
    where asked)."""
    if o.dtype == "gguf":
        why = kquant.kernel_missing() or (None if (ref.embedded or ref.gguf) else
                                          f"{ref.disp!r} is not a GGUF file (the k-quant path reads GGUF files)")
        if why is None:
            lm = _kept_targets.pop(ref.identity(), None)
            if lm is None:
                with ref.gguf_file(progress) as path:
                    if progress:
                        progress(f"reading {ref.disp}'s Q4_K and Q6_K blocks", 0.5)
                    lm = kquant.lean_from_gguf(path)
            return Loaded(lm, loader=lambda: ref.float_model(torch.float32, o.device), repr="gguf")
        log.warning("the target cannot run on its GGUF blocks here (%s): the int8 target runs, activations per "
                    "token", why)
        o = replace(o, dtype="int8", activations="row")
    prompts = smoothing_prompts(tok, config, ref.disp) if o.dtype == "int8" and o.int8_smoothing else None
    if o.dtype == "ov4":
        lm = from_cache(ref, config, progress, "ov4", key={"role": "target"}, bits="ort4")
        return Loaded(OvLM.from_lean(lm), loader=lambda: ref.float_model(torch.float32, o.device))
    if o.dtype == "int8" and o.target_impl == "lean":
        smoothed = {"alpha": smoothing.ALPHA, "prompts": digest(prompts)} if prompts else None
        shipped = shipped_maxima(ref.identity(), prompts) if prompts and ref.embedded else None
        lm = from_cache(ref, config, progress, key={"role": "target", "smoothing": smoothed},
                        rows={"row": True, "pass": False}.get(o.activations, "auto"),
                        smooth_prompts=prompts, maxima=shipped)
        maxima = load_maxima(ref.int8_dir())
        t = Loaded(lm, loader=lambda: to_repr(ref.float_model(torch.float32, o.device), "int8", maxima=maxima),
                   smoothing=SMOOTHED if prompts else "")
    else:
        model = ref.float_model(o.act_dtype, o.device, o.device_map, progress)
        maxima = maxima_for(model, ref.disp, prompts) if prompts else None
        if o.dtype == "int8":
            model = to_repr(model, "int8", maxima=maxima)
        t = Loaded(LeanLM(model) if o.target_impl == "lean" else HFLM(model), model,
                   smoothing=SMOOTHED if maxima is not None else "")
    if o.dtype == "int8" and o.activations == "row":
        t.lm.int8_per_row()
    t.repr = o.dtype
    return t


def from_cache(ref: ModelRef, config, progress: Progress | None, suffix: str = "", *, key: dict,
               rows: bool | str = False, **how) -> LeanLM:
    """``ref``'s lean model mapped from its int8 cache (a 4-bit one's in the folder named ``-suffix``), converted
    once where the cache was made for another ``key`` (role and options; ``how``: ``convert``'s keywords)."""
    four = {"bits": "ort4", "ort_format": ORT_FORMAT} if how.get("bits") == "ort4" else {}
    path = ref.int8_dir()
    return cached_lean(path.with_name(f"{path.name}-{suffix}") if suffix else path,
                       {"format": FORMAT, "source": ref.identity(), **key, **four}, lambda: ref.source(progress),
                       config, rows=rows, name=ref.disp, progress=progress, **how)


def load_draft(ref: ModelRef, t_config, tok, pair: tuple, o: LoadOptions, progress: Progress | None) -> Loaded:
    """The draft, on the lean path where it can run, proposing among ``draft_vocab_ids`` cut to the rows
    the target shares. ``pair``: the pair's id and special token ids."""
    config = ref.config()
    vd, vt = config.vocab_size, t_config.vocab_size
    rows = shared_rows(vd, vt, len(tok))
    int8 = o.draft_weights in CPU_DRAFT_REPRS      # int8 or 4-bit weights, float32 activations
    dt = o.act_dtype if o.draft_weights == "same" else (torch.float32 if int8 else DTYPES[o.draft_weights])
    why = lean_unsupported(config)
    if o.draft_impl == "lean" and why:
        raise ModelLoadError(f"--draft-impl lean cannot run {ref.disp!r}: {why}")
    pair_id, special = pair
    vocab_ids = draft_vocab_ids(pair_id, tok, special, vd, o.draft_vocab)
    if rows is not None:        # the draft proposes among the rows both have (its logits map back to ids)
        vocab_ids = torch.arange(rows) if vocab_ids is None else vocab_ids[vocab_ids < rows]
        if why or o.draft_impl == "hf":
            raise ModelLoadError(f"draft and target output layers differ in size ({vd} vs {vt} rows): only the "
                                 "lean draft path can propose among the rows they share")
    lean = o.draft_impl in ("auto", "lean") and not why
    if not lean and vocab_ids is not None and o.draft_vocab != "auto":
        raise ModelLoadError("a reduced draft vocabulary needs the lean draft path (--draft-impl lean)")
    if o.draft_impl == "auto" and why:
        log.info("draft %s runs through transformers: %s", ref.disp, why)
    d_repr = o.draft_weights if int8 else str(dt).removeprefix("torch.")
    if d_repr == "ort4" and (why or o.draft_impl == "hf" or ort_missing()):
        log.warning("the draft cannot run on ONNX Runtime here (%s): int8 runs instead",
                    ort_missing() or why or "the transformers path has no ONNX Runtime layers")
        d_repr = "int8"
    if d_repr in GGUF_DRAFTS:
        gguf_why = why or kquant.kernel_missing() or (None if (ref.embedded or ref.gguf) else
                                                     f"{ref.disp!r} is not a GGUF file")
        if gguf_why is None and lean:
            with ref.gguf_file(progress) as path:
                if progress:
                    progress(f"reading {ref.disp}'s blocks", 0.5)
                lm = kquant.lean_from_gguf(path, vocab_ids, four_bit=d_repr == "q4_0")
            return Loaded(lm, loader=lambda: quantize_int8(ref.float_model(torch.float32, o.device)), repr=d_repr)
        log.warning("the draft cannot run on its GGUF blocks here (%s): int8 runs instead",
                    gguf_why or "the transformers path was asked for")
        d_repr = "int8"
    if lean and int8:           # int8 and ort4 run on the CPU only (LoadOptions.validated)
        bits = "ort4" if d_repr == "ort4" else 8
        key = {"role": "draft", "vocab": digest(vocab_ids.tolist()) if vocab_ids is not None else None}
        try:
            lm = from_cache(ref, config, progress, d_repr if bits != 8 else "", key=key, vocab_ids=vocab_ids, bits=bits)
            lm = OrtLM.from_lean(lm) if bits == "ort4" else lm
        except ModelLoadError:
            raise
        except (ValueError, RuntimeError) as e:    # shapes a 4-bit layout cannot take, a graph ONNX Runtime refuses
            if bits == 8:
                raise
            log.warning("the draft cannot run in %s (%s): int8 runs instead", d_repr, str(e).splitlines()[0][:200])
            return load_draft(ref, t_config, tok, pair, replace(o, draft_weights="int8"), progress)
        return Loaded(lm, loader=lambda: quantize_int8(ref.float_model(torch.float32, o.device)), repr=d_repr)
    model = ref.float_model(dt, o.device, progress=progress)
    if progress and lean:
        progress("building the lean draft path", 0.5)
    lm = LeanLM(model, vocab_ids=vocab_ids, int8=int8) if lean else None
    if int8:
        model = quantize_int8(model)   # for transformers' assisted generation and the hf path
    return Loaded(lm if lm is not None else HFLM(model), model, repr=d_repr)


def static_engine(target_lm, draft_lm, d_ref: ModelRef | None, o: LoadOptions, progress: Progress | None):
    """Both lean models on the static engine; where that fails, the eager ones if auto chose it (logged)."""
    if draft_lm is not None and (not isinstance(draft_lm, LeanLM) or isinstance(draft_lm, OrtLM)):
        raise ModelLoadError(f"the static engine cannot run the draft {d_ref.disp!r} (not the lean path, or "
                             "on ONNX Runtime; use --engine eager)")
    try:
        return static_pair(target_lm, draft_lm, o.static_capacity, o.engine == "compiled", progress)
    except Exception as e:      # noqa: BLE001 - auto falls back to eager on any failure; a chosen engine says why
        first = (str(e).strip().splitlines() or [""])[0][:300]
        if not o.fallback:
            raise ModelLoadError(str(e) if isinstance(e, CompileError) else
                                 f"the {o.engine} engine failed on {o.device} ({type(e).__name__}: {first}); "
                                 "use --engine eager") from e
        log.warning("the %s engine (--engine auto's choice on %s) failed: %s: %s; running the eager engine "
                    "instead (choose it with --engine eager to skip this attempt)", o.engine, o.device,
                    type(e).__name__, first)
        if progress:
            progress(f"the {o.engine} engine failed ({type(e).__name__}): running the eager engine", 0.95)
        release_memory()
        return target_lm, draft_lm


def smoothing_prompts(tok, config, name: str) -> list[list[int]] | None:
    """The calibration prompts' token ids, or None (logged) where they hold ids beyond the embeddings."""
    prompts = calibration_prompt_ids(lambda p: encode_prompt(tok, p))
    if any(max(ids, default=0) >= config.vocab_size for ids in prompts):
        log.info("int8 target %s is quantised without smoothing: the calibration prompts hold token ids beyond "
                 "its %d embeddings", name, config.vocab_size)
        return None
    return prompts


def auto_engine(dev: torch.device, device_map=None) -> str:
    """``--engine auto``'s choice: static on one CUDA device (CUDA graphs), eager elsewhere."""
    return "static" if dev.type == "cuda" and device_map is None else "eager"


def static_pair(target_lm, draft_lm, capacity: int, compiled: bool, progress: Progress | None = None):
    """Both lean models as static ones (``csd.runtime.static``), each checked once against its eager pass."""
    longest = max(GAMMA_RANGE[1], CSDConfig().gamma_max) + 1      # a block of the longest gamma, or copies
    target = make_static(target_lm, capacity, target_shapes(longest), progress, "target", compiled)
    draft = make_static(draft_lm, capacity, draft_shapes(), progress, "draft", compiled) if draft_lm is not None \
        else None
    for lm, eager in ((target, target_lm), (draft, draft_lm)):
        if lm is not None:
            check_replay(lm, eager)
    return target, draft


def check_replay(static, eager, ids=(9, 2, 11, 4)) -> None:
    """RuntimeError unless a static pass gives finite logits within 5% of the eager ones' range."""
    a = static.forward(static.new_cache(), list(ids), len(ids)).float()
    b = eager.forward(eager.new_cache(), list(ids), len(ids)).float()
    gap = float((a - b).abs().max()) if torch.isfinite(a).all() else float("inf")
    if gap > 0.05 * float(b.abs().max()) + 1e-3:
        raise RuntimeError(f"its first pass differs from the eager engine's by {gap:.3g} in a logit")

