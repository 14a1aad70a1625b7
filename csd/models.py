"""Model loading: the embedded Qwen2.5-Coder 0.5B/1.5B pair, or any Hugging Face pair.

``load_pair`` puts the pieces together: the shipped pair made loadable (``csd.embedded``), the
target's representation chosen by measurement (``csd.profile``) and built (``csd.quant``, smoothed
first by ``csd.smoothing``), the decode paths (``csd.lm``), and the result, a ``csd.pair.ModelPair``.
It imports them; none of them imports it.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from . import smoothing
from .config import GAMMA_RANGE, CSDConfig
from .embedded import prepare_embedded
from .events import Progress
from .fileio import read_json
from .lm import HFLM, LeanLM, lean_unsupported
from .pair import EMBEDDED, EMBEDDED_PAIR_ID, ModelLoadError, ModelPair, encode_prompt, special_token_ids
from .profile import choose_target_repr
from .quant import (
    DTYPES,
    INT8_ACTIVATIONS,
    INT8_ACTIVATIONS_DEFAULT,
    TARGET_REPRS,
    memory_gib,
    quantize_int8,
    release_memory,
    to_repr,
)
from .static import DEFAULT_CAPACITY, ENGINES, STATIC_ENGINES, CompileError, draft_shapes, make_static, target_shapes

log = logging.getLogger(__name__)

DEFAULT_PAIR = "embedded"
EMBEDDED_ALIASES = {"embedded", "default", "embedded-draft", "embedded-target",
                    EMBEDDED["draft"].name, EMBEDDED["target"].name}
DRAFT_DTYPES = ("auto", "same", "float32", "bfloat16", "float16", "int8")
DRAFT_IMPLS = ("auto", "hf", "lean")
TARGET_IMPLS = ("auto", "hf", "lean")
DRAFT_VOCAB_FILE = Path(__file__).parent / "data" / "draft_vocab.json.gz"


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
    if name == "int8" and device.type != "cpu":
        raise ModelLoadError("int8 (dynamic quantisation) runs on the CPU only; choose bfloat16 or float16 on a GPU")
    return name


def _resolve_source(name: str, role: str, progress: Progress | None) -> tuple[str, str]:
    """(path or hub id to load, display name)."""
    if name in EMBEDDED_ALIASES:
        return str(prepare_embedded(role, progress)), EMBEDDED[role].name
    p = Path(name).expanduser()
    if p.exists():
        return str(p), p.name
    return str(hub_snapshot(name, role, progress)), name


HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]   # weights, config, tokenizer


def hub_snapshot(repo_id: str, role: str, progress: Progress | None = None) -> Path:
    """A Hugging Face hub model as a local directory: from the hub's cache, else downloaded when the
    machine is online (``HF_HUB_OFFLINE`` unset). ModelLoadError says which of the two failed."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True))
    except HFValidationError as e:
        raise ModelLoadError(f"cannot load {role} model {repo_id!r}: not a local directory nor a hub id "
                             f"({str(e).splitlines()[0]})") from None
    except Exception:      # not in the cache (the hub's own error types vary by version)
        pass
    from huggingface_hub.constants import HF_HUB_OFFLINE
    if HF_HUB_OFFLINE:
        raise ModelLoadError(f"cannot load {role} model {repo_id!r}: not a local directory and not in the hub "
                             "cache, and HF_HUB_OFFLINE is set (unset it on a machine with a network to download)")
    if progress:
        progress(f"downloading {role} {repo_id} from the Hugging Face hub", 0.0)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as e:      # no network, no such repository, a gated one: the hub's message says which
        raise ModelLoadError(f"cannot load {role} model {repo_id!r}: not a local directory, not in the hub cache, "
                             f"and the download failed ({type(e).__name__}: {str(e).splitlines()[0]})") from None


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


def out_of_memory(role: str, disp: str, src: str, dtype: torch.dtype, dev: torch.device,
                  trust_remote_code: bool = False) -> str:
    """What a load that ran out of memory says: the model, its representation, what its weights need
    (from its config: a Llama-family count), and what the device had free."""
    need = ""
    try:
        from transformers import AutoConfig
        c = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code)
        h, n_layers, inter, vocab = c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size
        hd = getattr(c, "head_dim", None) or h // c.num_attention_heads
        q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
        params = vocab * h * (1 if getattr(c, "tie_word_embeddings", False) else 2) \
            + n_layers * (h * (q + 2 * kv) + q * h + 3 * h * inter)
        need = f"; its weights need about {params * dtype.itemsize / 2**30:.1f} GiB"
    except Exception:        # noqa: BLE001 - an estimate only: the message stands without it
        pass
    free = ""
    if dev.type == "cuda":
        got, total = torch.cuda.mem_get_info(dev)
        free = f", {got / 2**30:.1f} of {total / 2**30:.1f} GiB free on {dev}"
    return (f"out of memory loading the {role} model {disp!r} in {str(dtype).removeprefix('torch.')} on {dev}"
            f"{need}{free}: try a smaller model, bfloat16/int8, or another device")


def shared_rows(draft_rows: int, target_rows: int, tokens: int) -> int | None:
    """None when the two output layers have the same rows; else the rows they share, where they differ
    only by padding past the tokenizer's tokens (Qwen2.5-0.5B has 151936 rows, Qwen2.5-7B 152064, for
    151665 tokens). Refused when a real token lacks a row in one of them."""
    if draft_rows == target_rows:
        return None
    if min(draft_rows, target_rows) < tokens:
        raise ModelLoadError(f"draft and target output layers differ in size ({draft_rows} vs {target_rows} rows) "
                             f"and one lacks rows for the tokenizer's {tokens} tokens")
    return min(draft_rows, target_rows)


def draft_vocab_ids(pair_id: str, tokenizer, special_ids, vocab_size: int, choice: str | int) -> torch.Tensor | None:
    """The token ids the draft may propose: None (all of them) or a reduced vocabulary. ``auto``:
    the shipped list for the embedded pair (the most frequent tokens of the target's own answers
    and the calibration corpus), all tokens otherwise; ``full``; or N, the first N of that list.
    Special tokens are always kept, so that the draft can propose the end of an answer. In SD the
    draft only proposes: this changes the speed, never the output."""
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
    if not 1 <= n:
        raise ModelLoadError(f"--draft-vocab must be auto, full or a positive number, got {choice!r}")
    keep = list(dict.fromkeys(ids[:n] + sorted(special_ids)))
    return torch.tensor(sorted(i for i in keep if i < vocab_size), dtype=torch.long)


def load_pair(draft: str | None = DEFAULT_PAIR, target: str = DEFAULT_PAIR, *, dtype: str | torch.dtype | None = "auto",
              device: str | None = "auto", device_map: str | dict | None = None, trust_remote_code: bool = False,
              progress: Progress | None = None, load_draft: bool = True, draft_dtype: str = "auto",
              draft_impl: str = "auto", draft_vocab: str | int = "auto", target_impl: str = "auto",
              int8_smoothing: bool = True, int8_activations: str = INT8_ACTIVATIONS_DEFAULT,
              check=None, engine: str = "auto", static_capacity: int = DEFAULT_CAPACITY) -> ModelPair:
    """Load a draft/target pair sharing one tokenizer. ``draft=None`` loads the target alone (AR only).

    ``dtype``: the target's representation, one of ``TARGET_REPRS`` or ``auto`` (chosen by measuring
    the candidates once on this machine, ``csd.profile.choose_target_repr``). ``draft_dtype``:
    "same", a float dtype, "int8" (CPU), or "auto" (int8 on the CPU, the target's dtype elsewhere).
    ``draft_impl``: "lean" (``csd.lm.LeanLM``, Llama-family drafts), "hf", or "auto" (lean where it
    can). ``draft_vocab``: see ``draft_vocab_ids``. The draft only proposes, so in SD its dtype,
    path and vocabulary change the speed, never the output.

    ``target_impl``: the target's forward pass in the decode loop: "hf" (transformers' own code),
    "lean" (``csd.lm.LeanLM``), or "auto": lean for an int8 target that it can run, transformers
    otherwise. For an int8 target lean computes what the transformers int8 model computes (its int8
    rows and per-row scales fused as they are, the same per-pass activation scale: 0.0 logit
    difference on the embedded pair) in about 0.8x its time (0.79-0.86x for passes of 1-12 tokens,
    side by side on a 2-core AMD EPYC). Packing the fused layers costs seconds per load, paid for by
    quantising the decoder blocks on all cores. The transformers model stays in ``pair.target`` for
    calibration and assisted generation.

    ``int8_smoothing``: before an int8 target is quantised, its activation outliers are moved into
    the weights (``csd.smoothing``, SmoothQuant; the float function is unchanged), so the per-pass
    activation scale of dynamic int8 rounds the other channels less coarsely. Llama-family targets
    only; the maxima it needs are measured once per model and cached.

    ``check(tokenizer, context_limit)``: called once the tokenizers are loaded and before any model
    is, so that a request the pair cannot serve (a prompt over the context) is refused in seconds,
    not after the load; it raises to refuse.

    ``engine``: "static" runs both lean models at fixed shapes on KV caches of ``static_capacity``
    tokens, with one CUDA graph per pass shape captured here at load on CUDA (``csd.static``);
    "eager" the paths above; "auto": static on CUDA, eager on the CPU (where the static function
    runs without graphs and attends over the whole capacity: slower). On CUDA, ``dtype`` auto is
    bfloat16."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    if engine not in ENGINES:
        raise ModelLoadError(f"unknown engine {engine!r}; choose {', '.join(ENGINES)}")
    if engine == "auto":
        engine = "static" if dev.type == "cuda" and device_map is None else "eager"
    if engine in STATIC_ENGINES and (device_map is not None or int(static_capacity) < 64):
        raise ModelLoadError("the static engine runs on one device with a KV cache of at least 64 tokens"
                             if device_map is None else "the static engine runs on one device (no --device-map)")
    if dtype in (None, "auto") and dev.type == "cuda":
        target_repr = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    elif dtype in (None, "auto"):
        target_repr = "auto"
    else:
        target_repr = check_repr(dtype, dev)
    if draft_dtype not in DRAFT_DTYPES:
        raise ModelLoadError(f"unknown draft dtype {draft_dtype!r}; choose {', '.join(DRAFT_DTYPES)}")
    if draft_impl not in DRAFT_IMPLS:
        raise ModelLoadError(f"unknown draft implementation {draft_impl!r}; choose {', '.join(DRAFT_IMPLS)}")
    if target_impl not in TARGET_IMPLS:
        raise ModelLoadError(f"unknown target implementation {target_impl!r}; choose {', '.join(TARGET_IMPLS)}")
    if not (draft_vocab in ("auto", "full") or (str(draft_vocab).isdigit() and int(draft_vocab) > 0)):
        raise ModelLoadError(f"--draft-vocab must be auto, full or a positive number, got {draft_vocab!r}")
    if int8_activations not in INT8_ACTIVATIONS:       # refused before any load, as the options above
        raise ModelLoadError(f"int8 activations {int8_activations!r}: choose {' or '.join(INT8_ACTIVATIONS)}")
    if draft_dtype == "auto":
        draft_dtype = "int8" if dev.type == "cpu" else "same"
    if draft_dtype == "int8" and dev.type != "cpu":
        raise ModelLoadError("draft dtype int8 (dynamic quantisation) runs on the CPU only")
    draft_name = draft if (draft is not None and load_draft) else None
    t_src, t_disp = _resolve_source(target, "target", progress)
    d_src, d_disp = _resolve_source(draft_name, "draft", progress) if draft_name else (None, None)

    def _load(src: str, disp: str, role: str, dtype_: torch.dtype, dm=None):
        if progress:
            progress(f"loading {role} {disp}", 0.0)
        kwargs = dict(dtype=dtype_, trust_remote_code=trust_remote_code)
        if dm is not None:
            kwargs["device_map"] = dm
        try:
            m = AutoModelForCausalLM.from_pretrained(src, **kwargs)
            if dm is None:
                m.to(dev)
        except (torch.OutOfMemoryError, MemoryError):
            raise ModelLoadError(out_of_memory(role, disp, src, dtype_, dev, trust_remote_code)) from None
        except OSError as e:
            raise ModelLoadError(f"cannot load {role} model {disp!r}: not a local directory and not "
                                 f"available offline from the hub cache ({str(e).splitlines()[0]})") from None
        except ValueError as e:
            raise ModelLoadError(f"cannot load {role} model {disp!r}: {e}") from None
        return m.eval()

    try:
        tok_t = AutoTokenizer.from_pretrained(t_src, trust_remote_code=trust_remote_code)
        tok_d = AutoTokenizer.from_pretrained(d_src, trust_remote_code=trust_remote_code) if d_src else None
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load tokenizer: {str(e).splitlines()[0]}") from None
    if tok_d is not None:
        diff = compare_tokenizers(tok_d, tok_t)
        if diff:
            raise ModelLoadError(f"draft {d_disp!r} and target {t_disp!r} do not share a tokenizer: {diff}")
    if check is not None:
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(t_src, trust_remote_code=trust_remote_code)
        check(tok_t, context_limit(config))

    if target_repr == "auto":   # before the target is loaded: each candidate is loaded afresh, one at a time
        target_repr, _ = choose_target_repr(lambda: _load(t_src, t_disp, "target", torch.float32, device_map),
                                            t_disp, dev, progress, int8_lean=target_impl != "hf" and device_map is None)
    load_dtype = torch.float32 if target_repr == "int8" else DTYPES[target_repr]
    target_model = _load(t_src, t_disp, "target", load_dtype, device_map)
    why_t = lean_unsupported(target_model) or (device_map is not None and "a device_map (the lean path runs on one device)")
    if target_impl == "lean" and why_t:
        raise ModelLoadError(f"--target-impl lean cannot run {t_disp!r}: {why_t}")
    if engine in STATIC_ENGINES and why_t:
        raise ModelLoadError(f"the static engine cannot run {t_disp!r}: {why_t} (use --engine eager)")
    if target_impl == "auto":   # lean for an int8 target (where it is faster) or the static engine, else transformers
        target_impl = "lean" if (target_repr == "int8" or engine in STATIC_ENGINES) and not why_t else "hf"
    if engine in STATIC_ENGINES and target_impl != "lean":
        raise ModelLoadError("the static engine runs the lean target path (not --target-impl hf)")
    maxima, smoothed = None, ""
    if target_repr == "int8" and int8_smoothing:
        maxima = smoothing.maxima_for(target_model, t_disp, lambda p: encode_prompt(tok_t, p), progress)
        smoothed = f"SmoothQuant alpha {smoothing.ALPHA}" if maxima is not None else ""
    if target_repr != "float32" or target_model.dtype != torch.float32:
        target_model = to_repr(target_model, target_repr, maxima=maxima)
    target_lm = None
    if target_impl != "hf":     # an int8 model's quantised layers are fused as they are (no second quantisation)
        if progress:
            progress("building the lean target path", 0.9)
        target_lm = LeanLM(target_model)
    acts = ""
    if target_repr == "int8":
        if int8_activations == "row":
            if target_lm is None:
                raise ModelLoadError("int8 activations per row need the lean target path (not --target-impl hf)")
            target_lm.int8_per_row()
        acts = int8_activations
    act_dtype = torch.float32 if target_repr == "int8" else DTYPES[target_repr]

    gen_cfg = getattr(target_model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None) or tok_t.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    if tok_t.eos_token_id is not None and tok_t.eos_token_id not in eos_ids:
        eos_ids = eos_ids + (tok_t.eos_token_id,)
    special = special_token_ids(tok_t, eos_ids)
    pair_id = EMBEDDED_PAIR_ID if (t_disp == EMBEDDED["target"].name and d_disp in (None, EMBEDDED["draft"].name)) \
        else f"{d_disp}->{t_disp}"

    draft_model, draft_lm, draft_repr = None, None, ""
    if d_src:
        d_dt = act_dtype if draft_dtype == "same" else (torch.float32 if draft_dtype == "int8" else DTYPES[draft_dtype])
        draft_model = _load(d_src, d_disp, "draft", d_dt)
        vd, vt = draft_model.get_output_embeddings().out_features, target_model.get_output_embeddings().out_features
        rows = shared_rows(vd, vt, len(tok_t))
        int8 = draft_dtype == "int8"
        draft_repr = "int8" if int8 else str(d_dt).removeprefix("torch.")
        why = lean_unsupported(draft_model)
        if draft_impl == "lean" and why:
            raise ModelLoadError(f"--draft-impl lean cannot run {d_disp!r}: {why}")
        vocab_ids = draft_vocab_ids(pair_id, tok_t, special, vd, draft_vocab)
        if rows is not None:        # the draft proposes among the rows both have (its logits map back to ids)
            vocab_ids = torch.arange(rows) if vocab_ids is None else vocab_ids[vocab_ids < rows]
            if why or draft_impl == "hf":
                raise ModelLoadError(f"draft and target output layers differ in size ({vd} vs {vt} rows): only the "
                                     "lean draft path can propose among the rows they share")
        if draft_impl in ("auto", "lean") and not why:
            if progress:
                progress("building the lean draft path", 0.5)
            draft_lm = LeanLM(draft_model, vocab_ids=vocab_ids, int8=int8)
        else:
            if vocab_ids is not None and draft_vocab != "auto":
                raise ModelLoadError("a reduced draft vocabulary needs the lean draft path (--draft-impl lean)")
            if draft_impl == "auto" and why:
                log.info("draft %s runs through transformers: %s", d_disp, why)
        if int8:
            draft_model = quantize_int8(draft_model)   # for transformers' assisted generation and the hf path
        if draft_lm is None:
            draft_lm = HFLM(draft_model)

    ctx = context_limit(target_model.config)
    release_memory()            # the float weights that quantising replaced
    if engine in STATIC_ENGINES:
        compiled = engine == "compiled"
        if draft_lm is not None and not isinstance(draft_lm, LeanLM):
            raise ModelLoadError(f"the static engine cannot run the draft {d_disp!r} (not the lean path; "
                                 "use --engine eager)")
        longest = max(GAMMA_RANGE[1], CSDConfig().gamma_max) + 1      # a block of the longest gamma, or copies
        try:
            target_lm = make_static(target_lm, static_capacity, target_shapes(longest), progress, "target", compiled)
            if draft_lm is not None:
                draft_lm = make_static(draft_lm, static_capacity, draft_shapes(), progress, "draft", compiled)
        except CompileError as e:
            raise ModelLoadError(str(e)) from e
    mem = memory_gib(torch.device(target_model.device) if device_map is None else dev)
    if progress:
        progress(f"models ready: {mem} GiB {'on the GPU' if dev.type == 'cuda' else 'resident'}", 1.0)
    return ModelPair(draft_model, target_model, tok_t, pair_id, d_disp or "", t_disp,
                     torch.device(target_model.device) if device_map is None else dev, act_dtype, eos_ids, ctx,
                     draft_dtype=draft_repr, target_repr=target_repr, special_ids=special,
                     target_lm=target_lm or HFLM(target_model), draft_lm=draft_lm, target_smoothing=smoothed,
                     int8_activations=acts, memory_gib=mem)
