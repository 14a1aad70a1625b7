"""Activation smoothing before dynamic int8 (SmoothQuant, Xiao et al. 2023, arXiv 2211.10438;
docs/bench-representation.md): input channel j of a linear layer is divided by
s_j = max|x_j|^alpha / max|W_j|^(1 - alpha) and the weight column j multiplied by it, the division folded
into what produces the input: the RMSNorm weights (q/k/v, gate/up), the up projection's rows (down), the
v projection's rows (o, one factor per v channel shared by its query heads). The maxima are measured on
float32 passes over a few calibration prompts (``csd.runtime.convert``)."""
from __future__ import annotations

import torch

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


def _factor(x_max: torch.Tensor, w_max: torch.Tensor, alpha: float) -> torch.Tensor:
    return (x_max.clamp(min=FLOOR) ** alpha / w_max.clamp(min=FLOOR) ** (1 - alpha)).clamp(min=FLOOR)


def _fold_into_norm(norm: torch.Tensor, weights: list[torch.Tensor], x_max: torch.Tensor, alpha: float) -> None:
    s = _factor(x_max, torch.stack([w.abs().amax(0).float() for w in weights]).amax(0), alpha)
    norm.div_(s.to(norm.dtype))
    for w in weights:
        w.mul_(s.to(w.dtype))


def layer_weights(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A transformers decoder layer's weight tensors (not copies): "ln1", "q", "k", "v", "o", "ln2", "gate", "up",
    "down", and "q_b" (...) where a bias exists."""
    a, m = layer.self_attn, layer.mlp
    mods = {"q": a.q_proj, "k": a.k_proj, "v": a.v_proj, "o": a.o_proj, "gate": m.gate_proj, "up": m.up_proj,
            "down": m.down_proj}
    w = {"ln1": layer.input_layernorm.weight.data, "ln2": layer.post_attention_layernorm.weight.data}
    for k, mod in mods.items():
        w[k] = mod.weight.data
        if mod.bias is not None:
            w[f"{k}_b"] = mod.bias.data
    return w


@torch.no_grad()
def smooth_layer(w: dict[str, torch.Tensor], x_max: dict[str, torch.Tensor], n_heads: int, n_kv: int,
                 head_dim: int, alpha: float = ALPHA) -> None:
    """Fold one decoder layer's smoothing factors into its float weights ``w`` (``layer_weights``), in place,
    from the maxima of the inputs of q/k/v ("qkv"), o ("o"), gate/up ("gu") and down ("down")."""
    groups = n_heads // n_kv
    x_max = {name: x_max[name].to(w["q"].device, torch.float32) for name in ("qkv", "o", "gu", "down")}
    _fold_into_norm(w["ln1"], [w["q"], w["k"], w["v"]], x_max["qkv"], alpha)
    _fold_into_norm(w["ln2"], [w["gate"], w["up"]], x_max["gu"], alpha)
    s = _factor(x_max["down"], w["down"].abs().amax(0).float(), alpha)
    w["up"].div_(s[:, None].to(w["up"].dtype))
    if "up_b" in w:
        w["up_b"].div_(s.to(w["up_b"].dtype))
    w["down"].mul_(s.to(w["down"].dtype))
    # o_proj's input channel (head h, dim d) is v's channel (h // groups, d): one factor per v channel
    x_o = x_max["o"].view(n_kv, groups, head_dim).amax(1)
    w_o = w["o"].abs().amax(0).float().view(n_kv, groups, head_dim).amax(1)
    s = _factor(x_o, w_o, alpha)                                                  # (kv heads, head_dim)
    w["v"].div_(s.reshape(-1)[:, None].to(w["v"].dtype))
    if "v_b" in w:
        w["v_b"].div_(s.reshape(-1).to(w["v_b"].dtype))
    w["o"].mul_(s[:, None, :].expand(-1, groups, -1).reshape(-1).to(w["o"].dtype))


def heads(cfg) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim) of a transformers config."""
    n_heads = cfg.num_attention_heads
    return n_heads, cfg.num_key_value_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads


@torch.no_grad()
def smooth(model: torch.nn.Module, maxima: dict[str, torch.Tensor], alpha: float = ALPHA) -> None:
    """Fold the smoothing factors into ``model`` in place (float weights; before quantising)."""
    for i, layer in enumerate(model.model.layers):
        smooth_layer(layer_weights(layer), {k: maxima[f"{i}.{k}"] for k in ("qkv", "o", "gu", "down")},
                     *heads(model.config), alpha)


def calibration_prompt_ids(encode) -> list[list[int]]:
    """Token ids of the prompts the maxima are measured on (``encode``: a pair's ``encode_prompt``)."""
    from ..corpus import read_prompts
    return [encode(r["prompt"]) for r in read_prompts()[::20][:CALIBRATION_PROMPTS]]
