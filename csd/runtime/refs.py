"""Models as the options name them: the shipped pair's aliases, a local folder, or a Hugging Face hub
id (from the hub's cache, or downloaded when online), resolved to a ``ModelRef`` that knows where its
config, tokenizer and weights are, and where its int8 conversion is cached."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..events import Progress
from ..fileio import cache_dir
from .convert import GGUFSource, ModuleSource, digest
from .embedded import assembled, file_identity, float_model, model_dir, prepare_embedded, prepare_gguf_file
from .pair import EMBEDDED, ModelLoadError

EMBEDDED_ALIASES = {"embedded", "default", "embedded-draft", "embedded-target",
                    EMBEDDED["draft"].name, EMBEDDED["target"].name}


@dataclass(frozen=True)
class ModelRef:
    """A model as the options name it, resolved: where its config and tokenizer are (``path``), what to
    call it, and whether it is one of the shipped pair (whose weights are read from its GGUF file)."""
    role: str
    disp: str
    path: str
    embedded: bool = False
    trust_remote_code: bool = False
    gguf: str = ""          # a local GGUF file the weights are read from (``--target PATH.gguf``)

    def config(self):
        from transformers import AutoConfig
        try:
            return AutoConfig.from_pretrained(self.path, trust_remote_code=self.trust_remote_code)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cannot read the config of {self.role} model {self.disp!r}: "
                                 f"{str(e).splitlines()[0]}") from None

    def float_model(self, dtype: torch.dtype, dev: torch.device, device_map=None,
                    progress: Progress | None = None) -> torch.nn.Module:
        """The transformers model in ``dtype`` on ``dev`` (or spread by ``device_map``)."""
        from transformers import AutoModelForCausalLM
        if progress:
            progress(f"loading {self.role} {self.disp}", 0.0)
        try:
            if self.embedded:
                return float_model(self.role, dtype, progress).to(dev)
            if self.gguf:
                m = AutoModelForCausalLM.from_pretrained(Path(self.gguf).parent, gguf_file=Path(self.gguf).name,
                                                         dtype=torch.float32)
                quantizer = getattr(m, "hf_quantizer", None)
                if quantizer is not None:
                    quantizer.remove_quantization_config(m)
                return m.to(dtype).to(dev).eval()
            m = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype, trust_remote_code=self.trust_remote_code,
                                                     **({"device_map": device_map} if device_map is not None else {}))
            return (m if device_map is not None else m.to(dev)).eval()
        except (torch.OutOfMemoryError, MemoryError):
            raise ModelLoadError(out_of_memory(self.role, self.disp, self.path, dtype, dev,
                                               self.trust_remote_code)) from None
        except OSError as e:
            raise ModelLoadError(f"cannot load {self.role} model {self.disp!r}: not a local directory and not "
                                 f"available offline from the hub cache ({str(e).splitlines()[0]})") from None
        except ValueError as e:
            raise ModelLoadError(f"cannot load {self.role} model {self.disp!r}: {e}") from None

    @contextmanager
    def source(self, progress: Progress | None = None):
        """Its float weights a tensor at a time (``csd.runtime.convert``): the GGUF file, or the loaded model."""
        if self.embedded or self.gguf:
            with self.gguf_file(progress) as gguf:
                yield GGUFSource(gguf)
        else:
            yield ModuleSource(self.float_model(torch.float32, torch.device("cpu"), progress=progress))

    @contextmanager
    def gguf_file(self, progress: Progress | None = None):
        """The GGUF file its weights come from: the shipped one assembled for the block, or the user's own."""
        if self.gguf:
            yield Path(self.gguf)
        elif self.embedded:
            with assembled(self.role, progress) as gguf:
                yield gguf
        else:
            raise ModelLoadError(f"{self.role} model {self.disp!r} is not a GGUF file: --dtype gguf reads GGUF files")

    def int8_dir(self) -> Path:
        """Where its int8 conversion is cached: beside the shipped model's tokenizer, or by path."""
        if self.embedded:
            return model_dir(self.role) / f"int8-{self.role}"
        return cache_dir() / "int8" / f"{Path(self.path).name[:40]}-{digest(self.path)}-{self.role}"

    def identity(self) -> str:
        """What its weights are: the shipped file's sha256, or a local folder's weight files by name, size
        and modification time (a changed file makes the cache a miss)."""
        if self.embedded:
            return EMBEDDED[self.role].sha256
        if self.gguf:
            return file_identity(Path(self.gguf))
        files = sorted(p for p in Path(self.path).iterdir() if p.suffix in (".safetensors", ".bin", ".json"))
        return digest([(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files])


def resolve(name: str, role: str, progress: Progress | None, trust_remote_code: bool = False) -> ModelRef:
    if name in EMBEDDED_ALIASES:
        return ModelRef(role, EMBEDDED[role].name, str(prepare_embedded(role, progress)), True)
    p = Path(name).expanduser()
    if p.suffix.lower() == ".gguf":
        if not p.is_file():
            raise ModelLoadError(f"{role} GGUF file {str(p)!r} does not exist")
        return ModelRef(role, p.name, str(prepare_gguf_file(p, progress)), gguf=str(p.resolve()))
    if p.exists():
        return ModelRef(role, p.name, str(p), trust_remote_code=trust_remote_code)
    return ModelRef(role, name, str(hub_snapshot(name, role, progress)), trust_remote_code=trust_remote_code)


HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]   # weights, config, tokenizer


def hub_snapshot(repo_id: str, role: str, progress: Progress | None = None) -> Path:
    """A Hugging Face hub model as a local directory: from the hub's cache, else downloaded when the
    machine is online (``HF_HUB_OFFLINE`` unset). ModelLoadError says which of the two failed."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True))
    except HFValidationError as e:
        raise ModelLoadError(f"cannot load {role} model {repo_id!r}: not a local directory nor a hub id "
                             f"({str(e).splitlines()[0]})") from None
    except Exception:      # not in the cache (the hub's own error types vary by version)
        pass
    from huggingface_hub.constants import HF_HUB_OFFLINE
    if HF_HUB_OFFLINE:
        raise ModelLoadError(f"cannot load {role} model {repo_id!r}: not a local directory and not in the hub "
                             "cache, and HF_HUB_OFFLINE is set (unset it on a machine with a network to download)")
    if progress:
        progress(f"downloading {role} {repo_id} from the Hugging Face hub", 0.0)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as e:      # no network, no such repository, a gated one: the hub's message says which
        raise ModelLoadError(f"cannot load {role} model {repo_id!r}: not a local directory, not in the hub cache, "
                             f"and the download failed ({type(e).__name__}: {str(e).splitlines()[0]})") from None


def out_of_memory(role: str, disp: str, src: str, dtype: torch.dtype, dev: torch.device,
                  trust_remote_code: bool = False) -> str:
    """What a load that ran out of memory says: the model, its representation, what its weights need
    (from its config: a Llama-family count), and what the device had free."""
    need = ""
    try:
        from transformers import AutoConfig
        c = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code)
        h, n_layers, inter, vocab = c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size
        hd = getattr(c, "head_dim", None) or h // c.num_attention_heads
        q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
        params = vocab * h * (1 if getattr(c, "tie_word_embeddings", False) else 2) \
            + n_layers * (h * (q + 2 * kv) + q * h + 3 * h * inter)
        need = f"; its weights need about {params * dtype.itemsize / 2**30:.1f} GiB"
    except Exception:        # noqa: BLE001 - an estimate only: the message stands without it
        pass
    free = ""
    if dev.type == "cuda":
        got, total = torch.cuda.mem_get_info(dev)
        free = f", {got / 2**30:.1f} of {total / 2**30:.1f} GiB free on {dev}"
    return (f"out of memory loading the {role} model {disp!r} in {str(dtype).removeprefix('torch.')} on {dev}"
            f"{need}{free}: try a smaller model, bfloat16/int8, or another device")
