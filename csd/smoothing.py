"""Activation smoothing before dynamic int8 (SmoothQuant, Xiao et al. 2023, arXiv 2211.10438).

Dynamic int8 quantises each pass's activations with one scale for the whole tensor (7 bits on x86).
A Llama-family model's activations carry a few channels hundreds of times larger than the rest, so
that scale is set by them and every other channel is rounded coarsely. Smoothing divides each input
channel j of a linear layer by s_j and multiplies the layer's weight column j by s_j: in float the
function is the same (the division is folded into the RMSNorm weight or the producing layer's rows),
but the activation's range shrinks and the weight, quantised per output row, takes the difference.
With s_j = max|x_j|^alpha / max|W_j|^(1 - alpha) (alpha = 0.5) both are equally hard to quantise.

Where each division goes, per decoder layer:

- q/k/v input: the input RMSNorm's weight; gate/up input: the post-attention RMSNorm's weight;
- down_proj input (silu(gate) * up): the up projection's rows;
- o_proj input (the attention output, head h dim d = v's kv head h // groups, dim d): the v
  projection's rows, one factor per v channel shared by the query heads of its group.

The maxima come from float32 forward passes over a few of the shipped calibration prompts (never the
benchmark's items), measured once per model and cached.
"""
from __future__ import annotations

import hashlib
import json
import logging

import torch

log = logging.getLogger(__name__)

ALPHA = 0.5
CALIBRATION_PROMPTS = 12      # every 20th prompt of the calibration split, through the chat template
FLOOR = 1e-5


def supported(model: torch.nn.Module) -> bool:
    """A Llama-family decoder whose layers have the modules smoothing folds into."""
    try:
        layer = model.model.layers[0]
        a, m = layer.self_attn, layer.mlp
        parts = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight, a.q_proj, a.k_proj,
                 a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
    except (AttributeError, IndexError, TypeError):
        return False
    return all(p is not None for p in parts) and all(isinstance(p, torch.nn.Linear) for p in parts[2:])


@torch.inference_mode()
def activation_maxima(model: torch.nn.Module, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    """Per input channel, the largest |activation| entering each group of linear layers, over
    ``prompts`` (token id lists): keys "L.qkv", "L.o", "L.gu", "L.down" for layer L."""
    vocab = model.get_input_embeddings().num_embeddings
    if any(max(ids, default=0) >= vocab for ids in prompts):
        raise ValueError(f"the calibration prompts hold token ids beyond the model's {vocab} embeddings")
    found: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(_mod, inp):
            x = inp[0].detach().float().abs().reshape(-1, inp[0].shape[-1]).amax(0)
            found[name] = torch.maximum(found[name], x) if name in found else x
        return record

    handles = []
    for i, layer in enumerate(model.model.layers):
        a, m = layer.self_attn, layer.mlp
        for name, mod in (("qkv", a.q_proj), ("o", a.o_proj), ("gu", m.gate_proj), ("down", m.down_proj)):
            handles.append(mod.register_forward_pre_hook(hook(f"{i}.{name}")))
    try:
        dev = next(model.parameters()).device
        for ids in prompts:
            model(torch.tensor([ids], device=dev))
    finally:
        for h in handles:
            h.remove()
    return {k: v.cpu() for k, v in found.items()}


def _factor(x_max: torch.Tensor, w_max: torch.Tensor, alpha: float) -> torch.Tensor:
    return (x_max.clamp(min=FLOOR) ** alpha / w_max.clamp(min=FLOOR) ** (1 - alpha)).clamp(min=FLOOR)


def _fold_into_norm(norm, linears, x_max: torch.Tensor, alpha: float) -> None:
    w_max = torch.stack([lin.weight.abs().amax(0).float() for lin in linears]).amax(0)
    s = _factor(x_max, w_max, alpha)
    norm.weight.div_(s.to(norm.weight.dtype))
    for lin in linears:
        lin.weight.mul_(s.to(lin.weight.dtype))


@torch.no_grad()
def smooth(model: torch.nn.Module, maxima: dict[str, torch.Tensor], alpha: float = ALPHA) -> None:
    """Fold the smoothing factors into ``model`` in place (float weights; before quantising)."""
    cfg = model.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    groups = n_heads // n_kv
    for i, layer in enumerate(model.model.layers):
        a, m = layer.self_attn, layer.mlp
        dev = a.q_proj.weight.device

        x_max = {name: maxima[f"{i}.{name}"].to(dev, torch.float32) for name in ("qkv", "o", "gu", "down")}
        _fold_into_norm(layer.input_layernorm, (a.q_proj, a.k_proj, a.v_proj), x_max["qkv"], alpha)
        _fold_into_norm(layer.post_attention_layernorm, (m.gate_proj, m.up_proj), x_max["gu"], alpha)
        s = _factor(x_max["down"], m.down_proj.weight.abs().amax(0).float(), alpha)
        m.up_proj.weight.div_(s[:, None].to(m.up_proj.weight.dtype))
        if m.up_proj.bias is not None:
            m.up_proj.bias.div_(s.to(m.up_proj.bias.dtype))
        m.down_proj.weight.mul_(s.to(m.down_proj.weight.dtype))
        # o_proj's input channel (head h, dim d) is v's channel (h // groups, d): one factor per v channel
        x_o = x_max["o"].view(n_kv, groups, head_dim).amax(1)
        w_o = a.o_proj.weight.abs().amax(0).float().view(n_kv, groups, head_dim).amax(1)
        s = _factor(x_o, w_o, alpha)                                                  # (kv heads, head_dim)
        a.v_proj.weight.div_(s.reshape(-1)[:, None].to(a.v_proj.weight.dtype))
        if a.v_proj.bias is not None:
            a.v_proj.bias.div_(s.reshape(-1).to(a.v_proj.bias.dtype))
        a.o_proj.weight.mul_(s[:, None, :].expand(-1, groups, -1).reshape(-1).to(a.o_proj.weight.dtype))


def calibration_prompt_ids(encode) -> list[list[int]]:
    """Token ids of the prompts the maxima are measured on (``encode``: a pair's ``encode_prompt``)."""
    from .corpus import read_prompts
    rows = read_prompts()[::20][:CALIBRATION_PROMPTS]
    return [encode(r["prompt"]) for r in rows]


def weights_fingerprint(model: torch.nn.Module, per_tensor: int = 1024) -> str:
    """A cheap digest of a model's weights (names, shapes and an even sample of each tensor's values):
    two models with the same name but other weights (a fine-tune in a folder of the same name, another
    quantisation) never share cached maxima. 1,024 values per tensor, where hashing every byte of the
    1.5B target would read 6 GB."""
    h = hashlib.sha1()
    for name, t in sorted(model.state_dict().items()):
        if not torch.is_floating_point(t):
            continue
        flat = t.detach().reshape(-1)
        h.update(f"{name}{tuple(t.shape)}".encode())
        h.update(flat[::max(1, flat.numel() // per_tensor)][:per_tensor].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def cached_maxima(model: torch.nn.Module, model_name: str, encode, progress=None) -> dict[str, torch.Tensor]:
    """The model's activation maxima on the calibration prompts: read from the cache, or measured
    once (float32 forward passes; about a minute for the 1.5B target on 2 cores) and cached."""
    from .fileio import atomic_write, cache_dir
    prompts = calibration_prompt_ids(encode)
    key = {"model": model_name, "weights": weights_fingerprint(model),
           "prompts": hashlib.sha1(json.dumps(prompts).encode()).hexdigest()[:16], "version": 2}
    path = cache_dir() / "smoothing" / (hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16] + ".pt")
    if path.exists():
        try:
            return torch.load(path, weights_only=True)
        except (OSError, RuntimeError, ValueError) as e:
            log.warning("ignoring unreadable smoothing maxima %s: %s", path, e)
    if progress:
        progress("measuring activation ranges for int8 smoothing (once per model)", 0.0)
    maxima = activation_maxima(model, prompts)
    import io
    buf = io.BytesIO()
    torch.save(maxima, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buf.getvalue())
    return maxima


def maxima_for(model: torch.nn.Module, model_name: str, encode, progress=None) -> dict[str, torch.Tensor] | None:
    """``cached_maxima`` for a model smoothing can run on, else None (logged): what every int8 target
    built from a float32 one (``load_pair``, ``bench.fidelity``) is smoothed with."""
    try:
        if not supported(model):
            raise ValueError("not a Llama-family decoder")
        return cached_maxima(model, model_name, encode, progress)
    except ValueError as e:
        log.info("int8 target %s is quantised without smoothing: %s", model_name, e)
        return None
