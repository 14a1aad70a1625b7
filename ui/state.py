"""What the app shares (``Services``: the pair, its decoder, the store, the model lane, settings), read-only, and
what each browser session owns (``Session``, held by a ``gr.State``: everything a user changes)."""
from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass, field

from csd.bench import frontier
from csd.config import CSDConfig
from csd.decode import Decoder
from csd.events import RunMetrics, TokenEvent
from csd.memory import CorrectionMemory
from csd.runtime.batch import Batcher, can_batch
from csd.runtime.pair import ModelPair
from csd.runtime.profile import decoder as measured_decoder
from csd.runtime.prompt_rows import PromptRows

from .lane import KINDS, Job, Lane
from .rules import RIVAL_FIELDS


@dataclass
class Settings:
    queue_size: int = 64              # events waiting in gradio's queue at most (docs/design.md, "The web app")
    concurrency: int = 1              # generations (model work) running at once; above 1 they decode together
    max_prompt_tokens: int = 2048     # longer prompts are refused: their prefill would hold the model for everyone
    shared_scope: bool = True         # offer the "all runs" scope (every user's runs) in Analyse and Explore
    max_new_tokens: int = 64          # default of the Generate slider
    max_new_tokens_limit: int = 512   # upper end of the sliders
    compare_tokens: int = 48          # default length of a comparison
    teach_tokens: int = 32            # default length of a teaching run
    calibrate_positions: int = 2000   # default size of a text calibration (~190 positions/s on 2 cores)
    calibrate_prompts: int = 8        # default number of prompts of a prompt calibration
    calibrate_answer_tokens: int = 64  # answer tokens per prompt of a prompt calibration
    events_limit: int = 500           # rows shown in the events table
    status_interval_s: float = 1.0    # how often a waiting or running page refreshes its status line
    frontier_file: str = str(frontier.FRONTIER_FILE)        # the committed frontiers the Analyse tab shows
    rivals_file: str = str(frontier.RIVALS_FILE)


@dataclass(frozen=True)
class RunSettings:
    """A run's settings as the page holds them (raw values, checked by ``common.make_config``): the bar's and the
    tab's own. A handler reads (services, prompt or scope, settings, session)."""
    method: str = "csd"
    chat: bool = True
    gamma: object = 6
    auto_gamma: bool = False
    show_spec: bool = False           # gamma auto drafts at least common.SHOW_SPECULATION tokens a block
    lam: object = 6
    log10_tau: object = -2
    temperature: object = 0
    max_new_tokens: object = 64
    seed: object = None
    lookup: bool = False
    hide_rejected: bool = False
    panes: tuple = ("ar", "sd", "csd")   # Compare's methods
    rivals: dict = field(default_factory=dict)   # the rivals' parameters by name (``rules.RIVAL_FIELDS``)

    @classmethod
    def from_inputs(cls, **values) -> RunSettings:
        """From component values by name: the rivals' go into ``rivals``, Compare's ``method_1``.. into ``panes``."""
        if "whatif_method" in values:      # Analyse's name for its rule
            values["method"] = values.pop("whatif_method")
        rivals = {f: values.pop(f) for f in RIVAL_FIELDS if f in values}
        panes = tuple(values.pop(k) for k in sorted(values) if k.startswith("method_"))
        return cls(**values, **({"panes": panes} if panes else {}), rivals=rivals)


@dataclass
class Services:
    pair: ModelPair
    decoder: Decoder
    store: object | None              # csd.db.store.Store, or None to run without recording
    settings: Settings = field(default_factory=Settings)
    base_memory: CorrectionMemory | None = None   # the default memory; each session gets a copy
    lane: Lane = field(default_factory=Lane)      # every user's requests for model work, in order
    default_activations: str = ""     # an int8 target's activation scales a new session runs with ("row"/"pass")
    decoders: dict = field(default_factory=dict)  # the decoder of each activation mode met so far
    batcher: object | None = None     # csd.runtime.batch.Batcher: the runs in flight decode together (concurrency > 1)
    model_threads: int = 0            # CPU threads of the model's passes (not of the thread that reads the page)

    def new_memory(self) -> CorrectionMemory:
        return CorrectionMemory(self.pair.pair_id) if self.base_memory is None else self.base_memory.copy()


def make_services(pair: ModelPair, store=None, settings: Settings | None = None, costs=None, solo=None) -> Services:
    """``costs``: the cost model of gamma "auto" (default: measured once, cached); ``solo``: the ``Batcher``'s."""
    settings = settings or Settings()
    decoder = measured_decoder(pair, costs, prompt_rows=PromptRows())     # the runs share the prompts' rows
    batcher = Batcher(pair, solo=solo) if settings.concurrency > 1 and can_batch(pair) else None
    # the model's threads, counted before the app keeps its other threads to one (csd.runtime.threads.one_core)
    return Services(pair, decoder, store, settings, decoder.default_memory(),
                    default_activations=pair.rep.activations, batcher=batcher,
                    model_threads=batcher.threads if batcher is not None else pair.describe()["threads"])


@dataclass
class RunView:
    """One run as the page shows it (events so far, then the final metrics)."""
    run_id: int | None
    prompt: str
    chat: bool
    cfg: CSDConfig
    events: list[TokenEvent] = field(default_factory=list)
    metrics: RunMetrics | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    first_token_s: float | None = None
    done: bool = False
    # how its pair ran (``ModelPair.describe``: its draft may be the solo one)
    pair: dict = field(default_factory=dict)


@dataclass
class Session:
    session_id: str
    memory: CorrectionMemory
    last: RunView | None = None                 # the last Generate (or Compare CSD) run
    ar_speed: dict = field(default_factory=dict)  # (prompt, chat) -> RunMetrics of an AR run
    teach: RunView | None = None
    teach_step: int = 0
    pending: dict[str, deque] = field(default_factory=lambda: {k: deque() for k in KINDS})  # asked, not started
    jobs: dict[str, Job] = field(default_factory=dict)   # the latest job of each kind (for the status line)
    activations: str = ""             # this user's exact-mode choice ("row"/"pass"); "": the app's default

    def all_jobs(self, kind: str | None = None) -> list[Job]:
        kinds = KINDS if kind is None else (kind,)
        out = [j for k in kinds for j in self.pending[k]]
        out += [j for k in kinds if (j := self.jobs.get(k)) is not None and j not in out]
        return out


def new_session(services: Services) -> Session:
    return Session(uuid.uuid4().hex, services.new_memory())
