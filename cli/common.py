"""What every subcommand shares: the model options, loading the pair, opening the store, progress bars."""
from __future__ import annotations

import argparse
import sys


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


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", default="embedded", help="draft model: 'embedded', a local path or a Hugging Face id")
    p.add_argument("--target", default="embedded", help="target model: 'embedded', a local path or a Hugging Face id")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights dtype (auto: bfloat16 on AMX CPUs and GPUs, else float32)")
    p.add_argument("--draft-dtype", default="auto", choices=["auto", "same", "float32", "bfloat16", "float16", "int8"],
                   help="draft dtype (auto: int8 dynamic quantisation on the CPU, the target's dtype on a GPU)")
    p.add_argument("--device", default="auto", help="auto (CUDA if available, else CPU), cpu, cuda, cuda:1 ...")
    p.add_argument("--device-map", default=None, help="transformers device_map for a target too big for one GPU (e.g. auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code from the model's repo")
    p.add_argument("--db", default=None, help="store URL (default: SQLite file in the user data dir, or $CSD_DB_URL)")
    p.add_argument("--no-db", action="store_true", help="do not record to the store")


def load_from_args(args, need_draft: bool = True):
    from csd.models import load_pair
    return load_pair(args.draft if need_draft else None, args.target, dtype=args.dtype, device=args.device,
                     device_map=args.device_map, trust_remote_code=args.trust_remote_code, progress=tqdm_progress(),
                     draft_dtype=args.draft_dtype)


def open_store(args):
    if args.no_db:
        return None
    from db.store import Store
    return Store.open(args.db)


