"""What every subcommand shares: the model options, loading the pair, opening the store, progress bars."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from csd.numbers import Field, NumberError
from csd.runtime.models import DRAFT_DTYPES, DRAFT_IMPLS, TARGET_IMPLS
from csd.runtime.quant import INT8_ACTIVATIONS, INT8_ACTIVATIONS_DEFAULT, TARGET_REPRS
from csd.runtime.static import DEFAULT_CAPACITY, ENGINES


def tqdm_progress():
    """A (message, fraction) callback drawing one tqdm bar per message on stderr."""
    from tqdm import tqdm
    state = {"bar": None, "msg": None}

    def cb(msg: str, frac: float) -> None:
        key = msg.split(":")[0]
        if state["msg"] != key:
            if state["bar"] is not None:
                state["bar"].close()
            state["bar"] = tqdm(total=1000, desc=key, file=sys.stderr, leave=False,
                                bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}")
            state["msg"] = key
        bar = state["bar"]
        bar.set_postfix_str(msg[len(key) + 1:].strip()[:60]) if ":" in msg else None
        bar.update(int(frac * 1000) - bar.n)

    return cb


def number(field: Field, flag: str, *words: str):
    """An argparse ``type=`` for a number flag: what is typed, read by ``field`` (csd.numbers) as the flag names it,
    or one of ``words`` as typed (--gamma's 'auto'). A refusal is the field's sentence, which argparse prints after
    "argument --tau:" and exits with 2, as for any bad flag: the same words as the app's boxes say."""
    named = field.named(flag)
    if words:
        named = replace(named, note=" or ".join([named.note, *map(repr, words)]).strip())

    def read(text: str):
        if text in words:
            return text
        try:
            return named.read(text)
        except NumberError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    read.__name__ = flag
    return read


def add_model_args(p: argparse.ArgumentParser, store: bool = True) -> None:
    """The options that choose and load the pair (the command line's and the app's), and, with
    ``store``, the command line's store options (the app has its own ``--db``)."""
    p.add_argument("--draft", default="embedded",
                   help="draft model: 'embedded', a local path, a .gguf file or a Hugging Face id")
    p.add_argument("--target", default="embedded",
                   help="target model: 'embedded', a local path, a .gguf file or a Hugging Face id")
    p.add_argument("--dtype", default="auto", choices=("auto",) + TARGET_REPRS,
                   help="the target's representation: gguf (the GGUF file's own Q4_K/Q6_K blocks, exact rows), "
                        "int8, ov4, or a float dtype; auto: on the CPU whichever of gguf and int8 `python -m csd "
                        "prepare` measured faster here (int8 until it has), bfloat16 on CUDA")
    p.add_argument("--draft-dtype", dest="draft_weights", default="auto", choices=DRAFT_DTYPES,
                   help="the draft's weights (auto: on the CPU int8, ort4, gguf or q4_0, whichever prepare "
                        "timed faster here, the target's dtype on a GPU; ort4: 4-bit groups of 128 on ONNX Runtime; "
                        "gguf: its GGUF file's own blocks; q4_0: those blocks rounded to 4 bits (Q4_0) on the same "
                        "kernel; int4 now runs ort4)")
    p.add_argument("--draft-impl", default="auto", choices=DRAFT_IMPLS,
                   help="the draft's forward pass: lean (fused, Llama-family), hf, auto (lean where it can)")
    p.add_argument("--target-impl", default="auto", choices=TARGET_IMPLS,
                   help="the target's forward pass: hf, lean (fused, Llama-family), auto (lean for an int8 target)")
    p.add_argument("--int8-smoothing", default="on", choices=("on", "off"),
                   help="for an int8 target: move activation outliers into the weights first (SmoothQuant)")
    p.add_argument("--int8-activations", dest="activations", default=INT8_ACTIVATIONS_DEFAULT, choices=INT8_ACTIVATIONS,
                   help="for an int8 target: one activation scale per token (row, and auto, the default: greedy SD "
                        "writes AR's answer) or per pass (lossy: a verify pass can round a near-tie differently; a few "
                        "percent faster on fbgemm) (docs/exactness.md)")
    p.add_argument("--draft-vocab", default="auto",
                   help="tokens the draft may propose: auto (the embedded pair's frequent-token list), full, or N")
    p.add_argument("--device", default="auto", help="auto (CUDA if available, else CPU), cpu, cuda, cuda:1 ...")
    p.add_argument("--engine", default="auto", choices=ENGINES,
                   help="static: fixed shapes replayed as CUDA graphs; compiled: static after torch.compile; eager: "
                        "op by op; auto: static on CUDA, eager on the CPU (docs/gpu.md)")
    p.add_argument("--static-capacity", type=int, default=DEFAULT_CAPACITY,
                   help="static engine: tokens each KV cache holds (prompt + answer + one block; default %(default)s)")
    p.add_argument("--device-map", default=None,
                   help="transformers device_map for a target too big for one GPU (e.g. auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code from the model's repo")
    if not store:
        return
    p.add_argument("--db", default=None, metavar="URL|FILE",
                   help="store URL or SQLite file (default: $CSD_DB_URL, else a SQLite file in the user data dir)")
    p.add_argument("--no-db", action="store_true", help="do not record to the store")


def load_options(args):
    """The ``csd.runtime.models.LoadOptions`` the model flags (``add_model_args``) name."""
    from csd.runtime.models import LoadOptions
    return LoadOptions(dtype=args.dtype, device=args.device, device_map=args.device_map,
                       trust_remote_code=args.trust_remote_code, draft_weights=args.draft_weights,
                       draft_impl=args.draft_impl, draft_vocab=args.draft_vocab, target_impl=args.target_impl,
                       int8_smoothing=args.int8_smoothing == "on", activations=args.activations,
                       engine=getattr(args, "engine", "auto"),
                       static_capacity=getattr(args, "static_capacity", DEFAULT_CAPACITY))


def app_draft_weights(args, concurrency: int | None) -> str:
    """The app's ``--draft-dtype``: as asked, but ``auto`` on the CPU is int8 where runs decode together
    (``concurrency`` not 1; None: the app's default): its steps for all runs are one matrix product that fbgemm runs
    well. ort4's are one call a run (8 runs at once made 1.17-1.19x the tokens a second with int8, docs/users.md),
    and the k-quant kernel's blocks of 32 take many rows slower than fbgemm (8 runs at once: 30.5 tok/s with int8,
    25.5 with q4_0, docs/cpu.md). A run alone drafts with the timed choice (``app_solo_draft``)."""
    from csd.runtime.models import resolve_device
    cpu = resolve_device(args.device).type == "cpu"
    one_by_one = "hf" in (args.draft_impl, args.target_impl)       # the transformers path decodes runs one by one
    if args.draft_weights == "auto" and concurrency != 1 and cpu and not one_by_one:
        return "int8"
    return args.draft_weights


def app_solo_draft(args, asked: str, pair, progress=None):
    """The batcher's draft for a run alone where the app drafts in int8 (``app_draft_weights``) though ``--draft-dtype
    auto`` (``asked``) chose another here (ort4, gguf or q4_0: faster alone, docs/users.md): ``pair`` drafting with it,
    else None."""
    from csd.runtime.models import load_pair
    from csd.runtime.profile import chosen_draft_weights
    if asked != "auto" or args.draft_weights != "int8" or (r := chosen_draft_weights()) == "int8":
        return None
    d = load_pair(args.draft, args.target, options=replace(load_options(args), draft_weights=r), progress=progress,
                  draft_alone=True)
    return replace(pair, draft_lm=d.lm, rep=replace(pair.rep, draft=r)) if d.repr == r else None


def choose_draft(args, progress=None) -> None:
    """``--draft-dtype auto`` on the CPU for the embedded draft: where this machine has not yet measured
    whether the draft runs faster in int8, ort4, on its GGUF blocks or on them at 4 bits, measure it once
    (``csd.runtime.profile.choose_draft_weights``)."""
    from csd.runtime.models import load_pair, resolve_device
    from csd.runtime.profile import draft_choice_file
    if args.draft_weights != "auto" or args.draft != "embedded" or resolve_device(args.device).type != "cpu" \
            or draft_choice_file().exists():
        return
    from csd.runtime.profile import choose_draft_weights
    print("CSD Explorer: timing the draft in int8, ort4, gguf and q4_0 once…", file=sys.stderr, flush=True)
    options = load_options(args)

    def draft_lm(r):
        pair = load_pair(args.draft, args.target, options=replace(options, draft_weights=r),
                         progress=progress or tqdm_progress(), draft_alone=True)
        if pair.repr != r:      # it fell back to another representation
            return None
        return pair.lm

    out = choose_draft_weights(draft_lm)
    print(f"draft representation: {out['choice']} ({', '.join(f'{r} {ms} ms' for r, ms in out['draft_ms'].items())} "
          "a token)", file=sys.stderr, flush=True)


def choose_target(args, progress=None) -> None:
    """``--dtype auto`` on the CPU: where this machine has not yet measured whether the target runs faster in int8
    or on its GGUF file's own blocks, measure it once (``csd.runtime.profile.choose_target_dtype``), one target
    loaded and timed after the other."""
    from csd.runtime.models import keep_target_lm, load_pair, resolve_device
    from csd.runtime.profile import target_choice_file
    if args.dtype != "auto" or resolve_device(args.device).type != "cpu" or target_choice_file().exists():
        return
    from csd.runtime.profile import choose_target_dtype
    print("CSD Explorer: timing the target in int8 and on its GGUF blocks once…", file=sys.stderr, flush=True)
    options = replace(load_options(args), activations="row")

    timed = {}          # the target timed last, still loaded: the app's own load takes it (``keep_target_lm``)

    def load(r: str):
        timed.clear()
        pair = load_pair(None, args.target, options=replace(options, dtype=r), progress=progress or tqdm_progress())
        if pair.rep.target != r:        # it fell back
            return None
        timed[r] = pair.target_lm
        return pair.target_lm

    out = choose_target_dtype(load)
    if out["choice"] == "gguf" and "gguf" in timed:
        keep_target_lm(args.target, timed.pop("gguf"))
    timed.clear()
    times = ", ".join(f"{r} {out['step_ms'][r]} ms a step and {out['verify_5_ms'][r]} ms a 5-token pass"
                      for r in out["step_ms"])
    print(f"target representation: {out['choice']} ({times})", file=sys.stderr, flush=True)


def load_from_args(args, need_draft: bool = True, check=None, progress=None):
    """The pair the flags name; ``check(tokenizer, context_limit)`` runs before the models load."""
    from csd.runtime.models import load_pair
    pair = load_pair(args.draft if need_draft else None, args.target, options=load_options(args),
                     progress=progress or tqdm_progress(), check=check)
    d = pair.describe()
    where = "on the GPU" if pair.device.type == "cuda" else "resident"
    graphs = sum(s["graphs"] for s in d["static"].values())
    print(f"loaded {pair.pair_id} ({pair.rep.target} target): {d['engine']} engine"
          f"{f', {graphs} CUDA graphs' if graphs else ''}, {pair.memory_gib} GiB {where}", file=sys.stderr, flush=True)
    return pair


def open_store(args):
    """The store ``--db`` names (a URL or a SQLite file), or None for ``--no-db`` or ``--db none`` (the app's
    spelling, which has no ``--no-db``); ``csd.db.store.StoreOpenError`` where it cannot be opened."""
    if getattr(args, "no_db", False) or (args.db or "").lower() == "none":
        return None
    from csd.db.store import Store
    return Store.open(args.db)


# the rivals' parameters in the command line's help ("{:g}": the default; the record is csd.rule.Rivals)
RIVAL_HELP = {
    "tau_lossy": "lossy: keep a draft token x when p(x) >= tau * p(top-1), tau in (0, 1] (default {:g}, CSD's "
                 "baseline; 1: exact SD)",
    "topk": "topk: x must be among the target's top k, k >= 1 (default {:g}: TensorRT-LLM's published example; its "
            "own default 1 with delta 0 is exact SD)",
    "delta": "topk: and p(x) >= p(top-1) - delta, in probability, delta >= 0 (default {:g}, the example's; "
             "TensorRT-LLM's default 0)",
    "posterior_threshold": "typical: keep x when p(x) > min(threshold, alpha * exp(-H)), threshold in (0, 1] "
                           "(default {:g}, vLLM's and Medusa's)",
    "posterior_alpha": "typical: alpha > 0 (default {:g}, vLLM's and Medusa's)",
    "win_len": "fly: forgive a mismatch when the next win_len - 1 draft tokens match, 2..32 (default {:g}, FLy's "
               "config); only blocks longer than win_len can forgive, so use a fixed --gamma above it (FLy: 15)",
    "entropy_thre": "fly: and only where the target's top-3 entropy is >= this, >= 0 (default {:g}, FLy's config; "
                    "<= 0.01 turns the gate off)",
}


def add_rival_args(p: argparse.ArgumentParser, what: str = "") -> None:
    """The rivals' parameters (csd.rule.Rivals), each read by its method only; ``what``: the runs they apply to."""
    from csd.config import RIVAL_FIELDS
    g = p.add_argument_group("rivals (relaxed acceptance rules, greedy only; docs/rivals.md)" + what)
    for f in RIVAL_FIELDS:
        g.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                       help=RIVAL_HELP[f.name].format(f.default))


def rival_values(args, changed_only: bool = False) -> dict:
    """The rivals' parameters from ``add_rival_args`` as CSDConfig fields (``changed_only``: those not at default)."""
    from csd.config import PARAM_METHOD
    from csd.rule import Rivals
    d = Rivals()
    return {name: getattr(args, name) for name in PARAM_METHOD
            if not changed_only or getattr(args, name) != getattr(d, name)}


def add_memory_policy_args(p: argparse.ArgumentParser) -> None:
    """``--memory-capacity`` and ``--memory-half-life``: what the run's correction memory forgets (docs/memory.md)."""
    p.add_argument("--memory-capacity", default=None, metavar="N",
                   help="keep at most N patterns in the correction memory (when full, the smallest count goes; "
                        "default: unbounded, the paper's)")
    p.add_argument("--memory-half-life", default=None, metavar="H",
                   help="halve every count each H observed divergences, so that old patterns fade (default: never)")


def memory_policy(args):
    """The ``csd.memory.MemoryPolicy`` the flags ask for, or None when neither is given; a value that is not a
    number > 0 (a capacity: a whole number) is refused with a sentence naming its flag (``ValueError``)."""
    from csd.memory import policy_from
    cap, half = getattr(args, "memory_capacity", None), getattr(args, "memory_half_life", None)
    if cap is None and half is None:
        return None
    return policy_from(cap, half, ("--memory-capacity", "--memory-half-life"))
