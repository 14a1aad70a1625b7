"""What the app shares (``Services``: the loaded pair, its decoder, the store, settings) and what
each browser session owns (``Session``: its memory copy, its last run, its teaching run).

The models are loaded once and shared read-only; everything a user changes lives in their
``Session``, held by a ``gr.State``.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from csd.config import CSDConfig
from csd.decode import Decoder
from csd.events import TokenEvent
from csd.memory import CorrectionMemory
from csd.models import ModelPair


@dataclass
class Settings:
    queue_size: int = 16              # events waiting in gradio's queue at most
    concurrency: int = 1              # generations (model work) running at once
    max_new_tokens: int = 64          # default of the Generate slider
    max_new_tokens_limit: int = 512   # upper end of the sliders
    compare_tokens: int = 48          # default length of a comparison
    teach_tokens: int = 32            # default length of a teaching run
    calibrate_positions: int = 2000   # default calibration size in the UI (~190 positions/s on 2 cores)
    events_limit: int = 500           # rows shown in the events table


@dataclass
class Services:
    pair: ModelPair
    decoder: Decoder
    store: object | None              # db.store.Store, or None to run without recording
    settings: Settings = field(default_factory=Settings)
    base_memory: CorrectionMemory | None = None   # the default memory; each session gets a copy

    def new_memory(self) -> CorrectionMemory:
        if self.base_memory is None:
            return CorrectionMemory(self.pair.pair_id)
        return self.base_memory.copy()


def make_services(pair: ModelPair, store=None, settings: Settings | None = None) -> Services:
    decoder = Decoder(pair)
    return Services(pair, decoder, store, settings or Settings(), decoder.default_memory())


@dataclass
class RunView:
    """One run as the page shows it (events so far, then the final metrics)."""
    run_id: int | None
    prompt: str
    chat: bool
    cfg: CSDConfig
    events: list[TokenEvent] = field(default_factory=list)
    metrics: dict | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    first_token_s: float | None = None
    done: bool = False


@dataclass
class Session:
    session_id: str
    memory: CorrectionMemory
    last: RunView | None = None                 # the last Generate (or Compare CSD) run
    ar_speed: dict = field(default_factory=dict)  # (prompt, chat) -> tokens/s of an AR run
    teach: RunView | None = None
    teach_step: int = 0
    stop: bool = False                          # set by a Stop button, read by the running loop


def new_session(services: Services) -> Session:
    return Session(uuid.uuid4().hex, services.new_memory())
