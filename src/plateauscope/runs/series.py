"""An imported run: a run directory that points at a checkpoint series written by another trainer.

``plateauscope import`` (:mod:`plateauscope.sources`) writes it; nothing is copied. Layout::

    series.json        the manifest (:data:`~plateauscope.runs.files.SERIES_FILE`): per checkpoint the step,
                       the file (an absolute path), its SHA-256 and size, its format, the architecture and
                       the tokenizer folder (or null: token ids only)
    model/config.json  the series' Hugging Face config: one model is built per series

Each checkpoint is checked against its SHA-256 when it is read (a file changed since the import is a
one-line RunError naming it), then read without unpickling code: safetensors, or ``torch.load`` with
``weights_only=True``. :class:`ImportedSeries` builds one model (a TransformerLens 4 bridge) and loads
every checkpoint's weights into it, so a long series runs in flat memory.

A checkpoint of a series on the Hugging Face hub (``plateauscope import hf:ORG/NAME``) also names its
repository, revision and commit; its file is where ``huggingface_hub``'s cache puts it, and may be absent
(not fetched yet, or evicted). An :class:`ImportedSeries` given a ``fetch`` (:data:`Fetch`; the readers of
series build one, :class:`plateauscope.sources.hf_hub.HubFetcher`) asks it for the file when the weights
are read, so that a step whose analysis is cached is never fetched.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from pickle import UnpicklingError  # what torch.load(weights_only=True) raises for a file that needs code
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from plateauscope.model.backend import BackendError, Model, boot_causal_lm, load_causal_lm_state, load_tokenizer
from plateauscope.runs.files import (
    MODEL_CONFIG_DIR,
    SERIES_FILE,
    SERIES_FORMAT,
    RunError,
    _one_line,
    read_json,
    verified_files,
    verify_run,
    write_json_atomic,
)

WEIGHT_FORMATS: tuple[str, ...] = ("safetensors", "torch", "nanogpt", "transformer_lens", "transformer_lens.safetensors")
"""How a checkpoint's file is read: ``safetensors``; ``torch``: a ``torch.save``'d Hugging Face state dict
(``pytorch_model.bin``); ``nanogpt``: nanoGPT's ``ckpt.pt`` (its ``model`` entry, GPT-2 layout);
``transformer_lens`` / ``transformer_lens.safetensors``: a TransformerLens state dict (HookedTransformer's
``blocks.0.attn.W_Q`` layout, or a TransformerBridge's ``blocks.0.attn.q.weight``) of a GPT-2-style model,
``torch.save``'d or as safetensors, converted to Hugging Face's GPT-2 (:func:`transformer_lens_to_gpt2`)."""


@dataclass(frozen=True)
class SeriesCheckpoint:
    """One checkpoint of an imported series, as the manifest records it."""

    step: int
    file: str
    """The weights' file, an absolute path."""
    sha256: str
    size: int
    format: str
    """One of :data:`WEIGHT_FORMATS`."""
    architecture: str
    """The Hugging Face architecture class, e.g. ``GPTNeoXForCausalLM``."""
    tokenizer: str | None = None
    """A folder holding the tokenizer's files, or None (the model reads token ids)."""
    repo: str | None = None
    """A checkpoint on the Hugging Face hub: its repository (``EleutherAI/pythia-70m``); None: a local file."""
    revision: str | None = None
    """The hub revision it was imported from (``step1000``)."""
    commit: str | None = None
    """The commit that revision named at the import: what is fetched (a branch moved since fetches the same bytes)."""

    @property
    def remote(self) -> bool:
        """Whether the file is fetched from the hub (it may be absent from the disk until then)."""
        return self.repo is not None


Fetch = Callable[[SeriesCheckpoint], Path]
"""Puts a remote checkpoint's file on the disk, checked against the manifest's SHA-256, and returns its path
(a one-line error naming the revision and file where it cannot)."""


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def decode_weights(data: bytes, fmt: str, name: str | os.PathLike,
                   hf_config: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict from a checkpoint file's bytes, never unpickling code; a file that is
    truncated, not of its format, or that would need code to unpickle is a one-line RunError naming ``name``.
    ``hf_config``: the series' Hugging Face config (the TransformerLens formats read its head count)."""
    if fmt.startswith("transformer_lens"):
        state = decode_weights(data, fmt.removeprefix("transformer_lens").lstrip(".") or "torch", name)
        return transformer_lens_to_gpt2(state, (hf_config or {}).get("n_head"), name)
    if fmt == "safetensors":
        try:
            return load_safetensors(data)
        except (SafetensorError, ValueError, RuntimeError) as e:
            raise RunError(f"{name}: not a complete safetensors file, truncated or damaged ({_one_line(e)})") from None
    if fmt not in WEIGHT_FORMATS:
        raise RunError(f"{name}: unknown checkpoint format {fmt!r} (one of {', '.join(WEIGHT_FORMATS)})")
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except UnpicklingError:
        raise RunError(f"{name}: refused: it needs code to be unpickled (only files that torch.load reads with "
                       "weights_only=True load; save the weights as safetensors or a plain state dict)") from None
    except (RuntimeError, EOFError, ValueError, OSError) as e:
        raise RunError(f"{name}: not a readable torch file, truncated or damaged ({_one_line(e)})") from None
    if fmt == "nanogpt":
        if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
            raise RunError(f"{name}: not a nanoGPT checkpoint (no 'model' state dict)")
        return nanogpt_to_hf(obj["model"])
    if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
        raise RunError(f"{name}: not a state dict of tensors")
    return obj


def weight_shapes(path: str | os.PathLike, fmt: str, hf_config: dict[str, Any] | None = None
                  ) -> dict[str, tuple[int, ...]]:
    """The tensor names and shapes of a checkpoint file: a safetensors file's from its header, its length
    checked against the header (a truncated file), without decoding the tensors; any other format's decoded
    (a file that needs code to unpickle is refused; ``hf_config`` as for :func:`decode_weights`). A one-line
    RunError naming the file."""
    path = Path(path)
    if fmt != "safetensors":
        return {k: tuple(v.shape) for k, v in decode_weights(path.read_bytes(), fmt, path, hf_config).items()}
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            raw = f.read(n) if 0 < n < (1 << 27) else b""
        tensors = {k: v for k, v in json.loads(raw).items() if k != "__metadata__"}
        shapes = {k: tuple(v["shape"]) for k, v in tensors.items()}
        end = max((v["data_offsets"][1] for v in tensors.values()), default=0)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        raise RunError(f"{path}: not a complete safetensors file, truncated or damaged (its header cannot be read)") from None
    size = path.stat().st_size
    if size != 8 + n + end:
        raise RunError(f"{path}: not a complete safetensors file, truncated or damaged ({size} bytes, "
                       f"its header names {8 + n + end})")
    return shapes


_NANOGPT_LINEAR = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def nanogpt_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """nanoGPT's GPT-2 state dict in Hugging Face's ``GPT2LMHeadModel`` layout: the same names (less a
    ``torch.compile`` prefix ``_orig_mod.``), its ``nn.Linear`` weights transposed into ``Conv1D``'s, and zero
    biases where it was trained with ``bias=False``."""
    out = {}
    for key, value in state.items():
        key = key.removeprefix("_orig_mod.")
        if key.endswith(".attn.bias"):  # the causal mask buffer of nanoGPT's slow attention
            continue
        out[key] = value.t().contiguous() if key.endswith(_NANOGPT_LINEAR) else value
    for key in [k for k in out if k.endswith(".weight") and not k.startswith(("lm_head", "transformer.w"))]:
        bias = key.removesuffix(".weight") + ".bias"  # bias=False: zero biases, Conv1D's [in, out] or LayerNorm's
        if bias not in out:
            out[bias] = torch.zeros(out[key].shape[-1], dtype=out[key].dtype)
    return out


_TL_BUFFERS = (".mask", ".IGNORE")
"""HookedTransformer's attention buffers (the causal mask, its fill value): rebuilt by every model, not weights."""
_TL_TOP = {"embed.W_E": "transformer.wte.weight", "pos_embed.W_pos": "transformer.wpe.weight",
           "ln_final.w": "transformer.ln_f.weight", "ln_final.b": "transformer.ln_f.bias"}
_TL_BLOCK = {"ln1.w": "ln_1.weight", "ln1.b": "ln_1.bias", "ln2.w": "ln_2.weight", "ln2.b": "ln_2.bias",
             "attn.b_O": "attn.c_proj.bias", "mlp.W_in": "mlp.c_fc.weight", "mlp.b_in": "mlp.c_fc.bias",
             "mlp.W_out": "mlp.c_proj.weight", "mlp.b_out": "mlp.c_proj.bias"}
"""HookedTransformer's names -> GPT-2's, for the tensors that keep their layout (``Conv1D`` is ``[in, out]``
like HookedTransformer's ``W_in`` / ``W_out``)."""
_TL_PER_HEAD = ("attn.W_Q", "attn.W_K", "attn.W_V", "attn.b_Q", "attn.b_K", "attn.b_V", "attn.W_O")


def _hooked_layout(state: dict[str, torch.Tensor], n_heads: int | None, name: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A TransformerLens state dict in HookedTransformer's layout: as it is, or a TransformerBridge's
    (``blocks.0.attn.q.weight``, what TransformerLens 4's ``tools.training`` saves of a ``boot_native``
    model) rearranged by :func:`plateauscope.model.backend._bridge_in_hooked_layout`."""
    if "embed.W_E" in state or "embed.weight" not in state:
        return state
    from plateauscope.model.backend import _bridge_in_hooked_layout

    if not n_heads:
        raise RunError(f"{name}: a TransformerBridge state dict needs its config's head count to be read")
    try:
        return _bridge_in_hooked_layout(state.items(), n_heads)
    except (KeyError, ValueError) as e:
        raise RunError(f"{name}: not a TransformerLens GPT-2-style state dict (cannot read {_one_line(e)}; "
                       "supported: LayerNorm, learned positions, MLP, one K/V per head)") from None


def transformer_lens_to_gpt2(state: dict[str, torch.Tensor], n_heads: int | None,
                             name: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A TransformerLens state dict of a GPT-2-style model (LayerNorm, learned absolute positions, an MLP in
    every block, one key and value per head) in Hugging Face's ``GPT2LMHeadModel`` layout, exactly:
    ``W_Q``/``W_K``/``W_V`` ``[n_heads, d_model, d_head]`` -> ``c_attn.weight`` ``[d_model, 3 * d_model]``,
    ``W_O`` ``[n_heads, d_head, d_model]`` -> ``c_proj.weight`` ``[d_model, d_model]``, ``W_U`` -> ``lm_head.weight``
    transposed and ``b_U`` -> ``lm_head.bias`` (the series' config adds that bias to GPT-2). Anything else (rotary
    tables, grouped K/V, gates, a model folded without its LayerNorm weights) is a one-line RunError naming ``name``."""
    state = {k: v for k, v in _hooked_layout(state, n_heads, name).items() if not k.endswith(_TL_BUFFERS)}
    if "blocks.0.attn.W_Q" in state and "blocks.0.ln1.w" not in state:
        raise RunError(f"{name}: no LayerNorm weights (blocks.0.ln1.w): a folded model (fold_ln) or one without "
                       "LayerNorm cannot be mapped back to GPT-2 exactly; save the unfolded model's state dict")
    out: dict[str, torch.Tensor] = {}
    per_head: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in _TL_TOP:
            out[_TL_TOP[key]] = value
        elif key == "unembed.W_U":
            out["lm_head.weight"] = value.t().contiguous()
        elif key == "unembed.b_U":
            out["lm_head.bias"] = value
        elif key.startswith("blocks.") and key.split(".", 2)[-1] in _TL_BLOCK:
            _, layer, rest = key.split(".", 2)
            out[f"transformer.h.{layer}.{_TL_BLOCK[rest]}"] = value
        elif key.startswith("blocks.") and key.split(".", 2)[-1] in _TL_PER_HEAD:
            per_head[key] = value
        else:
            raise RunError(f"{name}: {key} has no GPT-2 counterpart (supported: LayerNorm, learned positions, "
                           "an MLP in every block, one key and value per head; not rotary, RMSNorm, grouped K/V, "
                           "gated MLPs)")
    layers = sorted({int(k.split(".")[1]) for k in per_head})
    for layer in layers:
        p = f"blocks.{layer}.attn."
        try:
            q, k, v = (per_head[p + w] for w in ("W_Q", "W_K", "W_V"))
            biases = [per_head[p + b] for b in ("b_Q", "b_K", "b_V")]
            w_o = per_head[p + "W_O"]
        except KeyError as e:
            raise RunError(f"{name}: {e.args[0]} is missing") from None
        if not q.shape == k.shape == v.shape or q.dim() != 3:
            raise RunError(f"{name}: {p}W_K has shape {tuple(k.shape)}, W_Q {tuple(q.shape)}: grouped or shared "
                           "keys and values have no GPT-2 counterpart")
        h = f"transformer.h.{layer}.attn."
        out[h + "c_attn.weight"] = torch.cat([w.permute(1, 0, 2).reshape(w.shape[1], -1) for w in (q, k, v)], dim=1)
        out[h + "c_attn.bias"] = torch.cat([b.reshape(-1) for b in biases])
        out[h + "c_proj.weight"] = w_o.reshape(-1, w_o.shape[-1]).contiguous()
    return out


def write_series(out: str | os.PathLike, checkpoints: list[SeriesCheckpoint], hf_config: dict[str, Any],
                 source: str, notes: list[str], model_files: dict[str, bytes] | None = None) -> Path:
    """Write an imported run directory at ``out`` (which must not exist, or be an empty folder): built in a
    temporary folder beside it and moved into place in one rename, so nothing is left half-written.
    ``model_files``: small files written beside the config in ``RUN/model/`` (a hub series' tokenizer)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunError(f"{out}: already exists; --out must be a new (or empty) folder")
    if not checkpoints:
        raise RunError(f"{source}: no checkpoints to import")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        write_json_atomic(tmp / MODEL_CONFIG_DIR / "config.json", hf_config)
        for name, data in (model_files or {}).items():
            (tmp / MODEL_CONFIG_DIR / name).write_bytes(data)  # inside the folder renamed into place at the end
        manifest = {"format": SERIES_FORMAT, "source": str(source), "notes": notes,
                    "checkpoints": [asdict(c) for c in sorted(checkpoints, key=lambda c: c.step)]}
        write_json_atomic(tmp / SERIES_FILE, manifest)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def is_imported(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` is an imported run (it has a :data:`SERIES_FILE`)."""
    return (Path(run_dir) / SERIES_FILE).is_file()


class ImportedSeries:
    """An imported run read back: its checkpoints by step, and one model the weights are loaded into."""

    def __init__(self, path: str | os.PathLike, fetch: Fetch | None = None):
        self.path = Path(path)
        self.fetch = fetch
        """Where a remote checkpoint's file comes from when it is read (:data:`Fetch`); None: the disk only."""
        raw = read_json(self.path / SERIES_FILE)
        if not isinstance(raw, dict) or raw.get("format") != SERIES_FORMAT:
            raise RunError(f"{self.path / SERIES_FILE}: not a series manifest of this toolkit")
        try:
            found = [SeriesCheckpoint(**c) for c in raw["checkpoints"]]
        except (KeyError, TypeError) as e:
            raise RunError(f"{self.path / SERIES_FILE}: not a series manifest of this toolkit ({_one_line(e)})") from None
        self.source: str = raw.get("source", "")
        self.notes: list[str] = raw.get("notes", [])
        self.checkpoints: dict[int, SeriesCheckpoint] = {c.step: c for c in found}

    @property
    def steps(self) -> list[int]:
        """Steps with a checkpoint, ascending."""
        return sorted(self.checkpoints)

    @property
    def architecture(self) -> str:
        """The series' architecture (one per series)."""
        return next(iter(self.checkpoints.values())).architecture

    @property
    def tokenizer(self) -> str | None:
        """The tokenizer folder of the series, or None (token ids)."""
        return next(iter(self.checkpoints.values())).tokenizer

    @functools.cached_property
    def loaded_tokenizer(self) -> Any:
        """The series' Hugging Face tokenizer (:attr:`tokenizer`'s files), or None (token ids)."""
        try:
            return load_tokenizer(self.tokenizer)
        except BackendError as e:
            raise RunError(str(e)) from None

    @functools.cached_property
    def hf_config(self) -> dict[str, Any]:
        """The series' Hugging Face config (read once)."""
        return json.loads((self.path / MODEL_CONFIG_DIR / "config.json").read_text())

    def checkpoint(self, step: int) -> SeriesCheckpoint:
        """The manifest's entry of ``step``, or a one-line RunError naming the steps that exist."""
        if step not in self.checkpoints:
            have = self.steps
            raise RunError(f"{self.path}: no checkpoint at step {step} (steps: {have[0]}..{have[-1]}, "
                           f"{len(have)} checkpoints)")
        return self.checkpoints[step]

    def checkpoint_path(self, step: int) -> Path:
        """The external file of ``step``."""
        return Path(self.checkpoint(step).file)

    def file(self, step: int) -> Path:
        """The weights file of ``step`` on the disk: a remote checkpoint's through :attr:`fetch` (without one, a
        file not fetched is a one-line RunError saying how to fetch it)."""
        entry = self.checkpoint(step)
        if not entry.remote:
            return Path(entry.file)
        if self.fetch is not None:
            return self.fetch(entry)
        if not Path(entry.file).is_file():
            raise RunError(f"{entry.file}: step {step} (revision {entry.revision} of hf:{entry.repo}) is not in the "
                           f"local Hugging Face cache; plateauscope analyze --run {self.path} fetches it")
        return Path(entry.file)

    def state(self, step: int) -> dict[str, torch.Tensor]:
        """The weights of ``step`` (a Hugging Face state dict), checked against the manifest's SHA-256."""
        entry = self.checkpoint(step)
        config = self.hf_config if entry.format.startswith("transformer_lens") else None
        file = self.file(step)
        try:
            data = file.read_bytes()
        except OSError as e:
            raise RunError(f"{file}: cannot be read ({_one_line(e)}), listed in {self.path / SERIES_FILE}") from None
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise RunError(f"{file}: changed since it was imported (its SHA-256 differs from "
                           f"{self.path / SERIES_FILE})")
        return decode_weights(data, entry.format, file, config)

    def verify(self) -> list[tuple[str, str]]:
        """Every problem of the series' checkpoint files against the manifest, in one pass, as (file, what is
        wrong): missing, truncated, or altered (another SHA-256 than at import). A hub checkpoint not in the cache
        is none (it is fetched when it is read)."""
        problems = []
        for step in self.steps:
            entry = self.checkpoint(step)
            if entry.remote and not Path(entry.file).exists():
                continue
            try:
                data = Path(entry.file).read_bytes()
            except OSError:
                problems.append((entry.file, "missing"))
                continue
            if hashlib.sha256(data).hexdigest() == entry.sha256 and len(data) == entry.size:
                continue
            problems.append((entry.file, f"truncated ({len(data)} of {entry.size} bytes)" if len(data) < entry.size
                             else f"altered (its SHA-256 differs from the one in {SERIES_FILE})"))
        return problems

    def build_model(self, device: str | torch.device = "cpu") -> Model:
        """The series' one model (weights not yet loaded)."""
        return boot_causal_lm(str(self.path / MODEL_CONFIG_DIR), device, self.tokenizer)

    def model(self, step: int, device: str | torch.device = "cpu", reuse: Model | None = None) -> Model:
        """The model at ``step``: ``reuse`` (a model this method returned before, on ``device``) with the step's
        weights loaded in place, or a new one."""
        state = self.state(step)
        model = reuse if reuse is not None else self.build_model(device)
        return load_causal_lm_state(model, state)


def verify_checkpoints(run_dir: str | os.PathLike) -> tuple[list[tuple[str, str]], int]:
    """``plateauscope verify`` of one run: its problems as (file, what is wrong) and the number of files checked; an
    imported run's checkpoints against ``series.json`` (:meth:`ImportedSeries.verify`), a run trained here's
    checkpoints and resume states against ``checksums.json`` (:func:`plateauscope.runs.files.verify_run`)."""
    run_dir = Path(run_dir)
    if is_imported(run_dir):
        series = ImportedSeries(run_dir)
        return series.verify(), len(series.steps)
    return [(str(run_dir / name), problem) for name, problem in verify_run(run_dir)], len(verified_files(run_dir))

