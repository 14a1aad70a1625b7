"""Convert once, then map (the cache's files: docs/models.md): ``convert`` writes the int8 lean model a decoder
layer at a time from a GGUF file or a transformers model, a target smoothed first, its manifest last; ``load`` maps
it back where the manifest matches; ``cached_lean`` builds it in a temporary directory renamed into place under a
lock, so a killed process or a full disk leaves the old cache or none."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from ..events import Progress
from .lm import LeanLM, PackedInt8Linear, _cat_bias, _linear
from .quant import RowInt8Linear, in_threads, onednn_exact, quantize_rows, release_memory
from .smoothing import ALPHA, heads, smooth_layer, supported

log = logging.getLogger(__name__)

FORMAT = 1        # bump when what ``convert`` writes changes: every cache of another format is rebuilt
PROJECTIONS = {"qkv": ("q", "k", "v"), "o": ("o",), "gu": ("gate", "up"), "down": ("down",)}
HF_LAYER = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
            "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
            "ln1": "input_layernorm", "ln2": "post_attention_layernorm"}
GGUF_LAYER = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o", "ffn_gate": "gate", "ffn_up": "up",
              "ffn_down": "down", "attn_norm": "ln1", "ffn_norm": "ln2"}


class CacheError(RuntimeError):
    """A converted cache that cannot be used (missing, truncated, of another format, source or options)."""


# -- sources: float weights a tensor at a time, under transformers' names ---------------------------------
def layer_name(i: int, key: str, bias: bool = False) -> str:
    return f"model.layers.{i}.{HF_LAYER[key]}.{'bias' if bias else 'weight'}"


class GGUFSource:
    """A GGUF file's tensors, dequantised one at a time, under transformers' names (the values equal
    transformers' own GGUF loader's, bit for bit: tests/test_convert.py)."""

    def __init__(self, path: str | os.PathLike):
        from .ggufile import GGUFFile
        self.file = GGUFFile(path)
        self.names = {self.hf_name(n): n for n in self.file.tensors}

    @staticmethod
    def hf_name(name: str) -> str:
        fixed = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
                 "output_norm.weight": "model.norm.weight"}
        if name in fixed:
            return fixed[name]
        blk, i, part, kind = name.split(".")
        if blk != "blk" or part not in GGUF_LAYER:
            raise ValueError(f"unknown GGUF tensor {name!r}")
        return layer_name(int(i), GGUF_LAYER[part], kind == "bias")

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def tensor(self, name: str, rows=None) -> torch.Tensor:
        return torch.from_numpy(self.file.dequantize(self.names[name], rows))

    def quantised_rows(self, name: str) -> tuple[np.ndarray, str] | None:
        """A quantised matrix's rows as stored (uint8, one row of blocks each) and the type's name."""
        import gguf
        qtype = gguf.GGMLQuantizationType(self.file.tensors[self.names[name]].qtype).name
        return None if qtype in ("F32", "F16", "BF16") else (self.file.raw(self.names[name]), qtype)


class ModuleSource:
    """A transformers model's weights (its state dict), as float32."""

    def __init__(self, model: torch.nn.Module):
        self.state = model.state_dict()

    def __contains__(self, name: str) -> bool:
        return name in self.state

    def tensor(self, name: str, rows=None) -> torch.Tensor:
        t = self.state[name].detach()
        return (t if rows is None else t[rows]).to(torch.float32, copy=True)

    def quantised_rows(self, name: str) -> None:
        return None


def layer_tensors(source, i: int) -> dict[str, torch.Tensor]:
    """Layer ``i``'s float32 weights under ``csd.runtime.smoothing.layer_weights``' keys."""
    w = {k: source.tensor(layer_name(i, k)) for k in HF_LAYER}
    for k in ("q", "k", "v", "o", "gate", "up", "down"):
        if layer_name(i, k, True) in source:
            w[f"{k}_b"] = source.tensor(layer_name(i, k, True))
    return w


class QuantisedRows:
    """An embedding kept as the GGUF file's quantised rows: ``rows[ids]`` dequantises only those rows."""

    def __init__(self, data: torch.Tensor, qtype: str, cols: int):
        import gguf
        self.data = data
        self.qtype = gguf.GGMLQuantizationType[qtype]
        self._dequantize = gguf.quants.dequantize
        self.shape = (data.shape[0], cols)

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.data[ids.view(-1).cpu()].numpy()
        return torch.from_numpy(np.asarray(self._dequantize(rows, self.qtype), dtype=np.float32))


# -- the streamed activation maxima (smoothing) --------------------------------------------------------
class _Record(torch.nn.Module):
    """A float layer that notes the largest |input| of each channel it sees."""

    def __init__(self, lin: torch.nn.Module):
        super().__init__()
        self.lin, self.max = lin, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.detach().abs().reshape(-1, x.shape[-1]).amax(0).float()
        self.max = m if self.max is None else torch.maximum(self.max, m)
        return self.lin(x)


def _float_layer(w: dict[str, torch.Tensor]) -> tuple:
    def lin(keys):
        return _Record(_linear(torch.cat([w[k] for k in keys]), _cat_bias([w.get(f"{k}_b") for k in keys]), False))
    return (w["ln1"], lin(PROJECTIONS["qkv"]), lin(PROJECTIONS["o"]), w["ln2"], lin(PROJECTIONS["gu"]),
            lin(PROJECTIONS["down"]))


@torch.inference_mode()
def _run_layer(cfg, layer: tuple, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """One float decoder layer over each prompt's hidden states (1, T, hidden), causal, no cache."""
    lean = LeanLM.from_parts(cfg, None, [layer], torch.ones(cfg.hidden_size), None)
    kv = {}

    def write(_li, k, v):
        kv["k"], kv["v"] = k[None], v[None]

    def attend(_li, q):
        return F.scaled_dot_product_attention(q, kv["k"], kv["v"], is_causal=True, scale=lean.scaling, enable_gqa=True)

    return [lean.layers_over(x, *lean._rope(torch.arange(x.shape[1])), write, attend) for x in xs]


def smoothed_layers(source, config, prompts: list[list[int]], progress: Progress | None = None):
    """(index, float32 weights, maxima) of each decoder layer in turn, smoothed with the maxima of its
    inputs measured on ``prompts`` run through the float layers so far (one layer in memory at a time)."""
    xs = [source.tensor("model.embed_tokens.weight", np.asarray(ids))[None] for ids in prompts]
    n_layers = config.num_hidden_layers
    for i in range(n_layers):
        if progress:
            progress(f"converting to int8: layer {i + 1} of {n_layers}", i / (n_layers + 1))
        w = layer_tensors(source, i)
        layer = _float_layer(w)
        xs = _run_layer(config, layer, xs)
        x_max = {name: mod.max for name, mod in zip(PROJECTIONS, layer[1:3] + layer[4:6])}
        smooth_layer(w, x_max, *heads(config), ALPHA)
        yield i, w, x_max


def activation_maxima(source, config, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    """Per input channel, the largest |activation| entering each group of linear layers over ``prompts``
    on float32 passes: keys "L.qkv", "L.o", "L.gu", "L.down" for layer L."""
    if any(max(ids, default=0) >= config.vocab_size for ids in prompts):
        raise ValueError(f"the calibration prompts hold token ids beyond the model's {config.vocab_size} embeddings")
    return {f"{i}.{k}": v for i, _w, x_max in smoothed_layers(source, config, prompts) for k, v in x_max.items()}


SHIPPED_MAXIMA = Path(__file__).parent.parent / "data" / "target_maxima.safetensors"


def shipped_maxima(sha256: str, prompts: list[list[int]]) -> dict[str, torch.Tensor] | None:
    """The embedded target's shipped activation maxima (``tools/shipped_maxima.py`` writes them), if measured
    on this model and these prompts; else None."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    try:
        with safe_open(SHIPPED_MAXIMA, framework="pt") as f:
            meta = f.metadata() or {}
    except (OSError, ValueError, RuntimeError):
        return None
    if meta.get("sha256") != sha256 or meta.get("prompts") != digest(prompts):
        return None
    return load_file(SHIPPED_MAXIMA)


def maxima_for(model: torch.nn.Module, model_name: str, prompts: list[list[int]]) -> dict[str, torch.Tensor] | None:
    """The activation maxima to smooth an int8 target made from ``model`` with, measured on ``prompts`` (the
    calibration prompts' ids), or None where smoothing cannot run (logged)."""
    try:
        if not supported(model):
            raise ValueError("not a Llama-family decoder")
        return activation_maxima(ModuleSource(model), model.config, prompts)
    except ValueError as e:
        log.info("int8 target %s is quantised without smoothing: %s", model_name, e)
        return None


def _int8(w: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    rows, scales = quantize_rows(w)
    return {f"{prefix}.w": rows, f"{prefix}.s": scales}


def _head(source, vocab_ids: torch.Tensor | None, chunk: int = 16384) -> dict[str, torch.Tensor]:
    """The output layer's int8 rows and scales (only ``vocab_ids``' rows where given), ``chunk`` rows at a time."""
    name = "lm_head.weight" if "lm_head.weight" in source else "model.embed_tokens.weight"
    rows = source.file.tensors[source.names[name]].shape[0] if isinstance(source, GGUFSource) \
        else source.state[name].shape[0]
    ids = np.arange(rows) if vocab_ids is None else vocab_ids.numpy()
    out = {}            # into arrays made once: a list joined at the end held the rows twice
    first = _int8(source.tensor(name, ids[:chunk]), "head")
    for k, v in first.items():
        out[k] = torch.empty((len(ids), *v.shape[1:]), dtype=v.dtype)
        out[k][:len(v)] = v

    def one(i: int) -> None:        # a chunk of rows, a core each (dequantising and quantising release the GIL)
        for k, v in _int8(source.tensor(name, ids[i:i + chunk]), "head").items():
            out[k][i:i + len(v)] = v
    in_threads(one, list(range(chunk, len(ids), chunk)))
    return out


def _nbits(w: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    from .ortlm import quantize_nbits
    return dict(zip((f"{prefix}.nq", f"{prefix}.ns", f"{prefix}.nz"), quantize_nbits(w)))


def _convert_layer(w: dict[str, torch.Tensor], bits: int | str = 8) -> dict[str, torch.Tensor]:
    out = {"ln1": w["ln1"], "ln2": w["ln2"]}
    encode = {8: _int8, "ort4": _nbits}[bits]
    for name, keys in PROJECTIONS.items():
        out |= encode(torch.cat([w[k] for k in keys]), name)
        biases = [w.get(f"{k}_b") for k in keys]
        if any(b is not None for b in biases):
            out[f"{name}.b"] = torch.cat([b if b is not None else torch.zeros(w[k].shape[0])
                                          for b, k in zip(biases, keys)])
    return {k: v.contiguous() for k, v in out.items()}


def layout(bits: int | str) -> str:
    """What a conversion writes, in its progress messages."""
    return "4-bit groups (ort4)" if bits == "ort4" else "int8"


def convert(source, config, out: Path, *, smooth_prompts: list[list[int]] | None = None,
            maxima: dict[str, torch.Tensor] | None = None, vocab_ids: torch.Tensor | None = None, key: dict,
            progress: Progress | None = None, bits: int | str = 8) -> Path:
    """Write the int8 lean model of ``source`` to the new directory ``out``, smoothed with ``maxima`` or with maxima
    measured on ``smooth_prompts`` (neither: not smoothed); ``vocab_ids``: the head's rows. ``bits="ort4"``: the
    decoder layers' weights in ONNX Runtime's 4-bit layout (``csd.runtime.ortlm.NBits``), the head int8."""
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    out.mkdir(parents=True)
    n_layers = config.num_hidden_layers

    def write(i: int, w: dict[str, torch.Tensor]) -> None:
        save_file(_convert_layer(w, bits), out / f"layer-{i:03d}.safetensors")
        w.clear()
        release_memory(collect=False)

    used = {}
    if smooth_prompts is not None and maxima is None:         # measured on the way: one layer after another
        for i, w, x_max in smoothed_layers(source, config, smooth_prompts, progress):
            used |= {f"{i}.{k}": v for k, v in x_max.items()}
            write(i, w)
    else:                                                      # layers apart: one a core
        def one(i: int) -> None:
            if progress:
                progress(f"converting to {layout(bits)}: layer {i + 1} of {n_layers}", i / (n_layers + 1))
            w = layer_tensors(source, i)
            if maxima is not None:
                smooth_layer(w, {k: maxima[f"{i}.{k}"] for k in PROJECTIONS}, *heads(config), ALPHA)
            write(i, w)
        in_threads(one, list(range(n_layers)))
        used = dict(maxima or {})
    release_memory()            # the layers' float copies, freed in the threads' own heaps
    if progress:
        progress(f"converting to {layout(bits)}: the output layer", n_layers / (n_layers + 1))
    save_file({"norm": source.tensor("model.norm.weight").contiguous(), **_head(source, vocab_ids),
               **({"vocab_ids": vocab_ids.to(torch.long).contiguous()} if vocab_ids is not None else {})},
              out / "head.safetensors")
    raw = source.quantised_rows("model.embed_tokens.weight")
    if raw is not None:
        save_file({"rows": torch.from_numpy(np.ascontiguousarray(raw[0]))}, out / "embed.safetensors",
                  metadata={"gguf_type": raw[1], "cols": str(config.hidden_size)})
    else:
        save_file({"weight": source.tensor("model.embed_tokens.weight").contiguous()}, out / "embed.safetensors")
    if used:
        save_file({k: v.contiguous() for k, v in used.items()}, out / "maxima.safetensors")
    (out / "config.json").write_text(config.to_json_string() if hasattr(config, "to_json_string")
                                     else json.dumps(vars(config)))
    files = {f.name: f.stat().st_size for f in sorted(out.iterdir())}
    manifest = {"key": key, "files": files, "seconds": round(time.perf_counter() - t0, 1), "bytes": sum(files.values())}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


def check(path: Path, key: dict) -> dict:
    """The manifest of a cache that can be used for ``key``; CacheError says why not."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except FileNotFoundError:
        raise CacheError("not converted yet") from None
    except (OSError, ValueError) as e:
        raise CacheError(f"an unreadable manifest ({e})") from None
    if manifest.get("key") != key:
        old = manifest.get("key") or {}
        diff = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k))
        raise CacheError(f"made for another {', '.join(diff) or 'version'}")
    for name, size in manifest.get("files", {}).items():
        f = path / name
        if not f.exists() or f.stat().st_size != size:
            raise CacheError(f"{name} is {'missing' if not f.exists() else 'truncated or changed'}")
    return manifest


def _linear_from(f, prefix: str, rows: bool):
    b = f.get_tensor(f"{prefix}.b").clone() if f"{prefix}.b" in f.keys() else None
    if f"{prefix}.nq" in f.keys():
        from .ortlm import NBits
        return NBits(*(f.get_tensor(f"{prefix}.{k}").clone() for k in ("nq", "ns", "nz")), b)
    w, s = f.get_tensor(f"{prefix}.w"), f.get_tensor(f"{prefix}.s").clone()
    return RowInt8Linear(w, s, b) if rows else PackedInt8Linear.from_int8(w, s, b)


def load(path: Path, key: dict, *, rows: bool | str) -> LeanLM:
    """The lean model mapped from a cache made for ``key``. ``rows``: every layer a ``RowInt8Linear`` (scales per
    token or per pass, switchable), else torch's packed dynamic int8 layers (5-10% faster a 1-token pass on fbgemm);
    "auto": rows where oneDNN runs every shape (``onednn_exact``: per token then costs no more), else packed."""
    from safetensors import safe_open

    check(path, key)
    cfg = SimpleNamespace(**json.loads((path / "config.json").read_text()))
    if auto := rows == "auto":      # the first layer's shapes and the head's, every layer's then
        with safe_open(path / "layer-000.safetensors", "pt") as f, safe_open(path / "head.safetensors", "pt") as h:
            files = zip([f] * len(PROJECTIONS) + [h], [*PROJECTIONS, "head"])
            rows = all(onednn_exact(g.get_tensor(f"{k}.w"), g.get_tensor(f"{k}.s")) for g, k in files)

    def layer(i):
        with torch.no_grad(), safe_open(path / f"layer-{i:03d}.safetensors", framework="pt") as f:
            built = (f.get_tensor("ln1").clone(), _linear_from(f, "qkv", rows), _linear_from(f, "o", rows),
                     f.get_tensor("ln2").clone(), _linear_from(f, "gu", rows), _linear_from(f, "down", rows))
        release_memory(collect=False)      # the copies made to pack it
        return built

    layers = in_threads(layer, list(range(cfg.num_hidden_layers)))
    with safe_open(path / "head.safetensors", framework="pt") as f:
        norm, head = f.get_tensor("norm").clone(), _linear_from(f, "head", rows)
        vocab_ids = f.get_tensor("vocab_ids").clone() if "vocab_ids" in f.keys() else None
    with safe_open(path / "embed.safetensors", framework="pt") as f:
        meta = f.metadata() or {}
        embed = QuantisedRows(f.get_tensor("rows"), meta["gguf_type"], int(meta["cols"])) if "gguf_type" in meta \
            else f.get_tensor("weight")
    release_memory()
    lm = LeanLM.from_parts(cfg, embed, layers, norm, head, vocab_ids)
    if rows:
        lm.int8_rows(auto)          # where auto chose rows, per token
    return lm


def load_maxima(path: Path) -> dict[str, torch.Tensor] | None:
    """The activation maxima a smoothed cache was made with (None where it was not smoothed)."""
    from safetensors.torch import load_file
    f = path / "maxima.safetensors"
    return load_file(f) if f.exists() else None


# -- the cache, built once ----------------------------------------------------------------------------
def digest(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextmanager
def _building(final: Path):
    """A temporary directory beside ``final`` that becomes ``final`` when the block ends well, else is removed."""
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_lean(path: Path, key: dict, open_source, config, *, rows: bool | str, name: str,
                progress: Progress | None = None, **how) -> LeanLM:
    """The lean int8 model cached at ``path`` for ``key``, converted first where the cache does not match.
    ``open_source()``: a context manager giving the float source. ``how``: ``convert``'s keywords."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_name(path.name + ".lock"))):
        try:
            check(path, key)
        except CacheError as e:
            for stale in path.parent.glob(f"{path.name}.tmp-*"):       # left by a killed conversion
                shutil.rmtree(stale, ignore_errors=True)
            if path.exists():
                log.warning("the int8 cache of %s is %s: converting it again", name, e)
            if progress:
                progress(f"converting {name} to {layout(how.get('bits', 8))} ({e}; once)", 0.0)
            try:
                with _building(path) as tmp, open_source() as source:
                    convert(source, config, tmp, key=key, progress=progress, **how)
                    del source      # its file's mapped pages go before the converted model is read (a peak)
            except OSError as e:
                from .pair import ModelLoadError
                raise ModelLoadError(f"cannot write the int8 cache of {name} in {path.parent} ({e}); nothing "
                                     "half-written was kept: free some disk space and start again") from None
            release_memory()
        return load(path, key, rows=rows)
