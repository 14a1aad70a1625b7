"""Measure the embedded target's activation maxima on the calibration prompts and write them where
``csd.runtime.convert.shipped_maxima`` reads them (``csd/data/target_maxima.safetensors``): a maintainer's step,
after the embedded target or the calibration prompts change (float32 passes a layer at a time, ~100 s).

    python -m tools.shipped_maxima
"""
from __future__ import annotations

from pathlib import Path


def write_shipped_maxima() -> Path:
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from csd.runtime.convert import SHIPPED_MAXIMA, GGUFSource, activation_maxima, digest
    from csd.runtime.embedded import assembled, gguf_config
    from csd.runtime.pair import EMBEDDED, encode_prompt
    from csd.runtime.refs import resolve
    from csd.runtime.smoothing import calibration_prompt_ids
    ref = resolve("embedded", "target", None)
    tok = AutoTokenizer.from_pretrained(ref.path)
    prompts = calibration_prompt_ids(lambda p: encode_prompt(tok, p))
    with assembled("target") as path:
        source = GGUFSource(path)
        maxima = activation_maxima(source, gguf_config(source.file), prompts)
    save_file({k: v.contiguous() for k, v in maxima.items()}, SHIPPED_MAXIMA,
              metadata={"sha256": EMBEDDED["target"].sha256, "prompts": digest(prompts)})
    return SHIPPED_MAXIMA


if __name__ == "__main__":
    print(write_shipped_maxima())
