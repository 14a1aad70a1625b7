"""Tiny in-process models for the UI tests: a readable 32-piece tokenizer, a target and a draft
that is a perturbed copy of it (so drafts are accepted often, rescued and rejected sometimes),
services around them, a gate that can hold the engine at a chosen forward pass, and the app
launched in this process (for gradio_client and the browser).

Nothing here downloads or reads model files: the models are random Qwen2 configurations built
in a second; the texts are words, punctuation, a piece of markup, a character split over two
byte tokens and two special tokens, so that the app's rendering meets each case.
"""
from __future__ import annotations

import contextlib
import re
import socket
import threading
from dataclasses import replace

import pytest
import torch

from conftest import perturbed, tiny_model
from csd.costs import CostModel
from csd.memory import CorrectionMemory
from csd.runtime.lm import HFLM
from csd.runtime.pair import ModelPair

XSS = "<img src=x onerror=alert(1)>"
PIECES = [" the", " a", " cat", " dog", " sat", " on", " mat", " ran", " to", " park", " and", " then", " it",
          " was", " happy", " big", " small", " red", " hill", " walked", ".", ",", "\n", " we", " saw", " tree",
          XSS, " ok"]
E_ACUTE = ("é".encode()[:1], "é".encode()[1:])     # ids 28, 29: one character in two byte tokens
IM_START, IM_END = 30, 31
SPECIAL = {IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
V = 32


class TinyTokenizer:
    """Greedy longest-match over ``PIECES``; any other character becomes a word (so every text
    encodes). ``decode`` joins the pieces' bytes, so id 28 alone is an incomplete character."""

    chat_template = None
    pad_token_id = IM_START
    all_special_ids = [IM_START, IM_END]
    added_tokens_decoder: dict = {}

    def _bytes(self, i: int) -> bytes:
        if i in SPECIAL:
            return SPECIAL[i].encode()
        if i in (28, 29):
            return E_ACUTE[i - 28]
        return PIECES[i].encode()

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        order = sorted(range(len(PIECES)), key=lambda k: -len(PIECES[k]))
        while i < len(text):
            for k in order:
                if text.startswith(PIECES[k], i):
                    ids.append(k)
                    i += len(PIECES[k])
                    break
            else:
                ids.append(ord(text[i]) % 20)
                i += 1
        return ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self.encode(text)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        return b"".join(self._bytes(i) for i in ids if not (skip_special_tokens and i in SPECIAL)).decode(
            "utf-8", errors="replace")


class Gate:
    """Holds the engine inside its ``hold_at``-th target forward pass (1 = the first prefill
    chunk of a run with a prompt, 2 = the first verify pass, ...) until ``release`` is set.
    ``reached`` tells the test that the engine is waiting there. The prompt's first token, fed in
    a pass of its own before the chunks (``csd.decode.prefill_spans``), is not counted."""

    def __init__(self):
        self.calls = 0
        self.hold_at: int | None = None
        self.reached = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def arm(self, hold_at: int | None) -> None:
        with self.lock:
            self.calls, self.hold_at = 0, hold_at
            self.reached.clear()
            self.release.clear()

    def open(self) -> None:
        self.hold_at = None
        self.release.set()

    def check(self) -> None:
        with self.lock:
            self.calls += 1
            hold = self.calls == self.hold_at
        if hold:
            self.reached.set()
            self.release.wait(timeout=120)


class GatedLM(HFLM):
    def __init__(self, model, gate: Gate):
        super().__init__(model)
        self.gate = gate

    def forward(self, cache, ids, keep):
        if not (self.length(cache) == 0 and len(ids) == 1):      # the first token's own pass
            self.gate.check()
        return super().forward(cache, ids, keep)


def tiny_ui_pair(gate: Gate | None = None, noise: float = 0.1) -> ModelPair:
    """A target and a perturbed copy as draft, over ``TinyTokenizer``; the end of turn is an end
    token, made rare so that answers run to their length. ``gate``: the target's forward passes
    go through it."""
    target = tiny_model(2)
    draft = perturbed(target, noise)
    with torch.no_grad():
        for m in (target, draft):
            m.lm_head.weight[IM_END].mul_(0.1)
    return ModelPair(draft=draft, target=target, tokenizer=TinyTokenizer(), pair_id="tiny-ui-draft->tiny-ui-target",
                     draft_name="tiny-draft", target_name="tiny-target", device=torch.device("cpu"),
                     dtype=torch.float32, eos_ids=(IM_END,), context_limit=256,
                     special_ids=frozenset(SPECIAL), target_lm=GatedLM(target, gate) if gate else None)


def tiny_memory(pair: ModelPair, count: int = 8) -> CorrectionMemory:
    """Every pattern of ordinary tokens seen ``count`` times: with lambda <= count the gate decides."""
    return CorrectionMemory(pair.pair_id, {(a, b): count for a in range(28) for b in range(28) if a != b})


FLAT_COSTS = CostModel(verify_ms={k: 10.0 + k for k in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33)}, draft_ms=2.0)


def tiny_services(store=None, gate: Gate | None = None, **settings):
    """The app's services on the tiny pair, with a memory where the gate decides, and a fixed cost
    model for gamma "auto" (nothing is measured)."""
    from csd.ui import Settings, make_services
    pair = tiny_ui_pair(gate)
    s = replace(Settings(), **settings)
    services = make_services(pair, store, s, costs=FLAT_COSTS)
    services.base_memory = tiny_memory(pair)
    return services


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(services):
    """The app on ``services``, launched in this process on a free port; yields its URL."""
    from csd.ui import build_demo, launch_kwargs
    demo = build_demo(services)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch_kwargs())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        demo.close()


# -- the handler tests' module fixtures (test_ui_handlers.py, test_ui_panels.py import them) -----------
PROMPT = "Write about the cat on the mat and the dog in the park."


@pytest.fixture(scope="module", name="store")
def ui_store(tmp_path_factory):
    """A real SQLite file for one test module."""
    from csd.db.store import Store
    s = Store.open(f"sqlite:///{tmp_path_factory.mktemp('ui-handlers') / 'ui.sqlite3'}")
    yield s
    s.close()


@pytest.fixture(scope="module", name="gate")
def ui_gate():
    return Gate()


@pytest.fixture(scope="module", name="services")
def ui_services(store, gate):
    return tiny_services(store, gate=gate)


def spans(html_text: str) -> list[str]:
    """The classes of the token spans in rendered HTML."""
    return re.findall(r'<span class="(tok [^"]*)"', html_text)


def gen(services, sess=None, prompt=PROMPT, method="csd", gamma=4, auto=False, lam=6, log10_tau=-0.5, max_new=24,
        lookup=False, temperature=0, show_spec=False):
    """The Generate handler's stream on the tiny pair (a fixed block of ``gamma`` unless ``auto``)."""
    from csd.ui.state import RunSettings
    from csd.ui.tabs import generate
    return generate.generate(services, prompt,
                             RunSettings(method, True, gamma, auto, show_spec, lam, log10_tau, temperature,
                                         max_new, 0, lookup), sess)
