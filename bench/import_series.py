"""Import plus the probe's cheap pass over a checkpoint series, against two loops a competent user writes.

The series: GPT-NeoX checkpoints saved by ``save_pretrained`` as Trainer-style ``checkpoint-N/`` folders in a
temporary folder (deleted after), of one of three shapes (``--shape``):

* ``small`` (the default): 4 layers, d_model 256, 8 heads, d_mlp 1024, vocabulary 1024, context 128;
* ``pythia-70m``: Pythia-70m's ``config.json`` (6 layers, d_model 512, 8 heads, d_mlp 2048, vocabulary 50304,
  context 2048, rotary on 25% of each head, parallel residual, untied unembedding);
* ``pythia-160m``: Pythia-160m's (12 layers, d_model 768, 12 heads, d_mlp 3072, the rest as Pythia-70m).

Checkpoint 0 is a seeded random init; each later one follows ``--train-steps`` AdamW steps on random tokens (0:
a seeded random init each). No tokenizer is saved: the probe reads token ids. The prompts are as long as the
induction probe needs (a copy of ``SEGMENT`` tokens at up to 9 lags: 25 tokens), whatever the context.

Three ways to the same numbers, per checkpoint, timed interleaved (ours, (a), (b), ours, (a), (b), ...) over the
same checkpoints for ``--rounds`` rounds (``small``: every checkpoint; the real shapes: the first 3 (``pythia-70m``)
or 1 (``pythia-160m``), ``--timed``), ``gc.collect()`` between the timed runs and never inside them:

* ours: ``plateauscope.sources.importer.import_series`` into a fresh run directory each round (so the pass's
  per-step cache, ``RUN/analysis/probe_*.jsonl``, is never reused; the import hashes and checks every file),
  then ``plateauscope.analysis.probe_pass.analyze_imported``: one bridge per series, each checkpoint's weights
  loaded into it; the probe's head scores (previous-token and induction, with their nulls, and
  ``head_detector``'s scores beside them), the in-context loss gap, and exact patching of every head's output
  on ``N_PAIRS`` prompt pairs, normalised by the clean-corrupted logit difference; then the heads named at the
  last step and the loss gap's transition (bootstrapped). Ours computes more than the baselines below.
* (a) a bridge per checkpoint: ``AutoModelForCausalLM.from_pretrained`` and
  ``TransformerBridge.boot_transformers(..., hf_model=...)`` in compatibility mode with no weight processing;
* (b) one bridge booted once, each checkpoint's safetensors state dict copied into the Hugging Face model the
  bridge wraps (its parameters kept by name before the boot: the bridge renames the modules), then each joint
  QKV attention's q / k / v re-split from the new weights (``set_original_component``: the bridge keeps them as
  copies, so without it the forward reads the first checkpoint's q / k / v), and ``eval()`` again.

Both baselines, under ``torch.inference_mode()``, with the probe's prompts built once per series: one
``run_with_cache`` of the scored sequences and their controls caching only the attention patterns, the
previous-token and induction head scores and the induction score's null and the loss gap from them, written by
hand; then ``run_with_cache`` on the clean prompts caching only each layer's ``hook_z`` and
``transformer_lens.patching.get_act_patch_attn_head_out_all_pos`` with the normalised logit difference.

Targets: ours at least 3x faster per checkpoint than (a) and 1.5x than (b) (medians over the rounds; each way's
min and max beside); the same numbers (the largest difference of the normalised head patching, and of the head
scores and loss gap, <= 1e-4); resident memory (``VmRSS``) that grows by at most 5% from the 2nd to the last
checkpoint of ours over the whole series (a pass of its own, in a fresh process). Then, where asked, the whole
``analyze`` (``plateauscope.analysis.probe_pass.analyze_series``: the pass, then every analysis on the probe's
data) on a few checkpoints, and the projected time of Pythia's 154 checkpoints (per-checkpoint cost x 154; ours'
from the memory pass, whose one-off costs are spread over the whole series).

The bench refuses a checkout with uncommitted changes (``--allow-dirty`` to develop). Results go to
``bench/results/import_series[-<shape>]-<machine>.json``.

    HF_HUB_OFFLINE=1 python bench/import_series.py [--shape small|pythia-70m|pythia-160m] [--checkpoints 20]
        [--timed N] [--rounds 3] [--train-steps 2] [--analyze N] [--device cpu] [--allow-dirty]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # transformer_lens.patching's bar, per patch

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from record import against, arguments, commit, print_rows, row, save

TARGET_VS_A = 3.0
TARGET_VS_B = 1.5
TARGET_RSS_GROWTH = 5.0
TARGET_DIFF = 1e-4
N_PAIRS = 8
"""Prompt pairs every way patches on."""
SEGMENT = 8
"""The induction probe's copy length."""
PYTHIA_CHECKPOINTS = 154
"""Checkpoints of each Pythia series (``step0`` .. ``step143000``)."""
_PYTHIA = dict(bos_token_id=0, eos_token_id=0, hidden_act="gelu", initializer_range=0.02, layer_norm_eps=1e-5,
               max_position_embeddings=2048, rotary_emb_base=10000, rotary_pct=0.25, tie_word_embeddings=False,
               use_parallel_residual=True, vocab_size=50304)
SHAPES = {
    "small": dict(vocab_size=1024, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024,
                  max_position_embeddings=128, tie_word_embeddings=False),
    "pythia-70m": dict(_PYTHIA, hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048),
    "pythia-160m": dict(_PYTHIA, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}
"""Each shape's GPTNeoXConfig fields (Pythia's ``config.json``, but its float16 ``torch_dtype``: float32 here)."""
TIMED = {"small": None, "pythia-70m": 3, "pythia-160m": 1}
"""Checkpoints each round times by default (None: all): the real shapes' rounds are short, to keep a run of
``pythia-160m`` near 20 minutes on 2 cores."""
ANALYZE = {"small": 3, "pythia-70m": 0, "pythia-160m": 0}
"""Checkpoints the whole ``analyze`` is timed on by default (0: not timed: at the real shapes it is too slow for
this bench, every checkpoint of so short a series being a landmark of the expensive pass)."""


def rss_mib() -> float:
    """Resident memory now (``VmRSS``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_series(out: Path, shape: str, n: int, train_steps: int) -> list[int]:
    """``n`` GPT-NeoX checkpoints of ``shape``, ``checkpoint-{100 i}/``: a seeded init, then ``train_steps`` AdamW
    steps on random tokens (batch 4 x 32) before each later save (0: a seeded init each)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(**SHAPES[shape])
    steps = [100 * i for i in range(n)]
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3) if train_steps else None
    gen = torch.Generator().manual_seed(0)
    for i, step in enumerate(steps):
        if i and optimiser is None:
            torch.manual_seed(i)
            model = GPTNeoXForCausalLM(config)
        for _ in range(train_steps if i else 0):
            tokens = torch.randint(0, config.vocab_size, (4, 32), generator=gen)
            model(tokens, labels=tokens).loss.backward()
            optimiser.step()
            optimiser.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save_pretrained(out / f"checkpoint-{step}")
    return steps


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# --- ours ---------------------------------------------------------------------------------------------------


def ours(source: Path, run_dir: Path, steps: list[int], device: str):
    """Import the steps into a new run directory, then the probe's pass; the result."""
    from plateauscope.analysis.probe_pass import analyze_imported
    from plateauscope.sources.importer import import_series

    run = import_series(source, run_dir, steps=steps, device=device).path
    return analyze_imported(run, device=device, progress=False, n_pairs=N_PAIRS, segment_len=SEGMENT)


def whole_analyze(source: Path, run_dir: Path, steps: list[int], device: str) -> None:
    """Import the steps into a new run directory, then the whole ``analyze`` (the pass and every analysis on the
    probe's data)."""
    from plateauscope.analysis.probe_pass import analyze_series
    from plateauscope.sources.importer import import_series

    run = import_series(source, run_dir, steps=steps, device=device).path
    analyze_series(run, probe_options={"segment_len": SEGMENT}, device=device, progress=False)


def memory_pass(source: Path, run_dir: Path, device: str) -> dict:
    """In this (fresh) process: import every checkpoint, the probe's pass over them; the resident memory at the
    2nd and the last checkpoint, and the seconds of the whole."""
    from plateauscope.analysis.probe_pass import analyze_imported
    from plateauscope.sources.importer import import_series

    rss: dict[int, float] = {}
    done: list[int] = []
    start = time.perf_counter()
    run = import_series(source, run_dir, device=device).path
    n = len(json.loads((run / "series.json").read_text())["checkpoints"])

    def on_step(step: int) -> None:
        done.append(step)
        if len(done) in (2, n):
            rss[len(done)] = rss_mib()

    analyze_imported(run, device=device, progress=False, on_step=on_step, n_pairs=N_PAIRS, segment_len=SEGMENT)
    return {"n": n, "rss": rss, "seconds": time.perf_counter() - start}


# --- the baselines -----------------------------------------------------------------------------------------


class ByHand:
    """What both baselines compute at a checkpoint, as a user writes it: the probe's prompts, built once per
    series; per checkpoint the head scores, the loss gap and TransformerLens's head patching."""

    def __init__(self, d_vocab: int, n_ctx: int, n_layers: int):
        from plateauscope.tasks.probe import build_probe

        self.probe = build_probe("induction", d_vocab, n_ctx, segment_len=SEGMENT)  # the same prompts as ours
        self.pairs = self.probe.prompt_pairs(N_PAIRS, 0)
        self.tokens = self.probe.scored_tokens()
        self.controls = self.probe.controls(self.tokens)["induction"]
        self.batch = torch.cat([self.tokens, self.controls])
        self.patterns = [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)]
        self.z = {f"blocks.{layer}.attn.hook_z" for layer in range(n_layers)}
        n, seq = self.tokens.shape
        same = self.tokens[:, :, None] == self.tokens[:, None, :]
        same &= ~torch.eye(seq, dtype=torch.bool)
        target = torch.zeros(n, seq, seq)
        target[:, :, 1:] = same[:, :, :-1].float()  # q attends to the token after an earlier copy of its own
        self.induction = torch.tril(target)
        self.rows = torch.arange(N_PAIRS)
        cfg = self.probe.cfg
        L, F = cfg.segment_len, cfg.max_gap
        self.first = self.probe.gaps[:n, None] + torch.arange(1, L)  # positions predicting s_2 .. s_L
        self.second = torch.arange(F + L + 1, F + 2 * L)  # positions predicting r_2 .. r_L

    def induction_score(self, patterns: torch.Tensor) -> torch.Tensor:
        """Per sequence and head: mean attention from each position with an induction target to its targets."""
        hit = (patterns * self.induction[:, None, None]).sum(-1)  # [N, L, H, q]
        has = self.induction.sum(-1) > 0  # [N, q]
        return (hit * has[:, None, None]).sum(-1) / has.sum(-1)[:, None, None]

    def logit_diff(self, logits: torch.Tensor) -> torch.Tensor:
        last = logits[:, self.pairs.pred_pos]
        return (last[self.rows, self.pairs.clean_answer] - last[self.rows, self.pairs.corrupt_answer]).mean()

    @torch.inference_mode()
    def at(self, model) -> dict[str, torch.Tensor]:
        """Head scores, loss gap and normalised head patching at the checkpoint ``model`` holds."""
        from transformer_lens import patching

        device = model.cfg.device
        logits, cache = model.run_with_cache(self.batch.to(device), names_filter=self.patterns)
        patterns = torch.stack([cache[name] for name in self.patterns], 1).float().cpu()  # [2N, L, H, q, k]
        n = len(self.tokens)
        scored, control = patterns[:n], patterns[n:]
        logprobs = logits[:n].float().cpu().log_softmax(-1)
        loss = -logprobs[:, :-1].gather(-1, self.tokens[:, 1:, None])[..., 0]  # position p predicts p + 1
        del logits, cache
        out = {"previous_token": scored.diagonal(-1, -2, -1).mean(-1).mean(0),
               "induction": self.induction_score(scored).mean(0),
               "induction_null": self.induction_score(control).mean(0),
               "loss_gap": (loss.gather(1, self.first).mean(1) - loss[:, self.second].mean(1)).mean()}

        clean_logits, clean_cache = model.run_with_cache(self.pairs.clean.to(device),
                                                         names_filter=lambda name: name in self.z)
        clean, corrupt = self.logit_diff(clean_logits), self.logit_diff(model(self.pairs.corrupt.to(device)))

        def metric(logits: torch.Tensor) -> torch.Tensor:
            return (self.logit_diff(logits) - corrupt) / (clean - corrupt)

        out["head_patching"] = patching.get_act_patch_attn_head_out_all_pos(model, self.pairs.corrupt.to(device),
                                                                            clean_cache, metric).cpu()
        out["denominator"] = (clean - corrupt).cpu()  # what the normalisation divides by
        return out


def boot(folder: str, hf_model, device: str):
    """A bridge of ``hf_model`` in compatibility mode, no weight processing."""
    from transformer_lens.model_bridge import TransformerBridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TransformerBridge.boot_transformers(folder, hf_model=hf_model, device=device)
        model.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return model


def baseline_a(source: Path, steps: list[int], device: str) -> list[dict]:
    """(a): for each checkpoint, ``from_pretrained`` and a bridge booted on it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source / f"checkpoint-{steps[0]}")
    hand = ByHand(config.vocab_size, config.max_position_embeddings, config.num_hidden_layers)
    results = []
    for step in steps:
        folder = str(source / f"checkpoint-{step}")
        model = boot(folder, AutoModelForCausalLM.from_pretrained(folder).to(device), device)
        results.append(hand.at(model))
        del model
    return results


def baseline_b(source: Path, steps: list[int], device: str) -> list[dict]:
    """(b): one bridge booted once; each checkpoint's state dict copied into the Hugging Face model under it and
    the joint QKV attention's q / k / v split again."""
    from safetensors.torch import load_file
    from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import JointQKVAttentionBridge
    from transformers import AutoModelForCausalLM

    first = str(source / f"checkpoint-{steps[0]}")
    hf_model = AutoModelForCausalLM.from_pretrained(first).to(device)
    params = dict(hf_model.state_dict(keep_vars=True))  # by Hugging Face's names: the boot renames the modules
    params["embed_out.weight"] = params["lm_head.weight"]  # GPT-NeoX's name in the file
    model = boot(first, hf_model, device)
    joint = [m for m in model.modules() if isinstance(m, JointQKVAttentionBridge)]
    hand = ByHand(model.cfg.d_vocab, model.cfg.n_ctx, model.cfg.n_layers)
    results = []
    for step in steps:
        state = load_file(source / f"checkpoint-{step}" / "model.safetensors", device=device)
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)
        for attention in joint:
            attention.set_original_component(attention.original_component)
        model.eval()  # the new q / k / v modules come in training mode, which patching refuses
        results.append(hand.at(model))
    return results


# --- the bench ----------------------------------------------------------------------------------------------


def spread(times: list[float]) -> tuple[float, float, float]:
    """Median, min and max."""
    return statistics.median(times), min(times), max(times)


def largest_difference(result, theirs: list[dict]) -> tuple[float, float, float, float]:
    """Between ours and a baseline, the largest difference of the normalised head patching, of the head scores and
    loss gap, and of the head patching in logits (the normalised difference times the clean-corrupted logit
    difference it was divided by); and the smallest such logit difference."""
    patched = scores = logits = 0.0
    smallest = float("inf")
    for step, t in zip(result.steps, theirs):
        diff = float((torch.tensor(step.head_patching) - t["head_patching"]).abs().nan_to_num().max())
        denominator = abs(float(t["denominator"]))
        patched, logits, smallest = max(patched, diff), max(logits, diff * denominator), min(smallest, denominator)
        for name in ("previous_token", "induction"):
            scores = max(scores, float((torch.tensor(step.head_scores[name]) - t[name]).abs().max()))
        scores = max(scores, float((torch.tensor(step.null_scores["induction"]) - t["induction_null"]).abs().max()),
                     abs(step.loss_gap - float(t["loss_gap"])))
    return patched, scores, logits, smallest


def main() -> int:
    """Build the series, time the three ways interleaved, compare their numbers, the memory pass, save the rows."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=list(SHAPES), default="small")
    p.add_argument("--checkpoints", type=int, default=20, help="checkpoints of the series (the memory pass's)")
    p.add_argument("--timed", type=int, default=None,
                   help="checkpoints each round times (default: all for small, 3 for pythia-70m, 1 for pythia-160m)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of (ours, (a), (b))")
    p.add_argument("--train-steps", type=int, default=2, help="AdamW steps between saves (0: a seeded init each)")
    p.add_argument("--analyze", type=int, default=None,
                   help="checkpoints the whole analyze is timed on (0: skip; default 3 for small, 0 for the others)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--allow-dirty", action="store_true", help="run on a checkout with uncommitted changes")
    p.add_argument("--memory-pass", nargs=2, metavar=("SOURCE", "RUN"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_pass:  # the child process of the memory pass
        print(json.dumps(memory_pass(Path(args.memory_pass[0]), Path(args.memory_pass[1]), args.device)))
        return 0
    if commit().endswith("+dirty") and not args.allow_dirty:
        print("import_series: the checkout has uncommitted changes; commit them (or --allow-dirty)", file=sys.stderr)
        return 2
    timed_n = min(args.timed or TIMED[args.shape] or args.checkpoints, args.checkpoints)
    analyze_n = min(ANALYZE[args.shape] if args.analyze is None else args.analyze, args.checkpoints)
    if args.rounds < 1 or args.checkpoints < 2 or timed_n < 1:
        print("import_series: --rounds >= 1, --checkpoints >= 2 and --timed >= 1", file=sys.stderr)
        return 2
    shape, rows, notes = args.shape, [], []
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="import_series-") as tmp:
        source = Path(tmp) / "trainer_out"
        start = time.perf_counter()
        steps = write_series(source, shape, args.checkpoints, args.train_steps)
        disk = folder_bytes(source)
        print(f"{shape}: {len(steps)} checkpoints written in {time.perf_counter() - start:.0f} s, "
              f"{disk / 1e9:.2f} GB", file=sys.stderr)
        timed = steps[:timed_n]

        # memory: ours over every checkpoint, in a fresh process
        child = subprocess.run([sys.executable, __file__, "--shape", shape, "--device", args.device, "--memory-pass",
                                str(source), str(Path(tmp) / "memory_run")], capture_output=True, text=True)
        if child.returncode:
            print(child.stderr, file=sys.stderr)
            raise SystemExit(f"import_series: the memory pass failed (exit {child.returncode})")
        memory = json.loads(child.stdout.strip().splitlines()[-1])
        shutil.rmtree(Path(tmp) / "memory_run", ignore_errors=True)
        print(f"memory pass: {memory}", file=sys.stderr)

        # the timed rounds, interleaved
        times: dict[str, list[float]] = {"ours": [], "a": [], "b": []}
        diffs = {"a": (0.0, 0.0, 0.0, float("inf")), "b": (0.0, 0.0, 0.0, float("inf"))}
        for r in range(args.rounds):
            results = {}
            for way in ("ours", "a", "b"):
                gc.collect()
                start = time.perf_counter()
                if way == "ours":
                    results[way] = ours(source, Path(tmp) / f"run-{r}", timed, args.device)
                else:
                    results[way] = (baseline_a if way == "a" else baseline_b)(source, timed, args.device)
                times[way].append((time.perf_counter() - start) / len(timed))
                print(f"round {r + 1}: {way} {times[way][-1]:.3f} s per checkpoint", file=sys.stderr)
            for way in ("a", "b"):
                found = largest_difference(results["ours"], results[way])
                diffs[way] = (*(max(d, f) for d, f in zip(diffs[way][:3], found[:3])), min(diffs[way][3], found[3]))
            del results
            shutil.rmtree(Path(tmp) / f"run-{r}", ignore_errors=True)

        analyze_s = None
        if analyze_n:
            gc.collect()
            start = time.perf_counter()
            whole_analyze(source, Path(tmp) / "analyze_run", steps[:analyze_n], args.device)
            analyze_s = (time.perf_counter() - start) / analyze_n
            print(f"whole analyze: {analyze_s:.3f} s per checkpoint", file=sys.stderr)
        else:
            notes.append(f"{shape}: the whole analyze (analyze_series) was not timed (--analyze 0): too slow at "
                         "this size for this bench's time (see the small shape's row)")
        if timed_n < len(steps):
            notes.append(f"{shape}: the rounds time {timed_n} of the {len(steps)} checkpoints (the series' one-off "
                         "costs, the import and the boot, weigh more per checkpoint than over a whole series); the "
                         f"memory pass times all {len(steps)} once")

    model = {"small": "a 4-layer 256-wide GPT-NeoX", "pythia-70m": "a Pythia-70m-shaped GPT-NeoX",
             "pythia-160m": "a Pythia-160m-shaped GPT-NeoX"}[shape]
    over = f"{shape}: {timed_n} of {len(steps)} checkpoints x {args.rounds} rounds" if timed_n < len(steps) \
        else f"{shape}: {timed_n} checkpoints x {args.rounds} rounds"
    (ours_m, ours_lo, ours_hi), (a_m, a_lo, a_hi), (b_m, b_lo, b_hi) = (spread(times[w]) for w in ("ours", "a", "b"))
    per_round_a = [a / o for a, o in zip(times["a"], times["ours"])]
    per_round_b = [b / o for b, o in zip(times["b"], times["ours"])]
    rss2, rss_n = memory["rss"]["2"], memory["rss"][str(memory["n"])]
    rows += [
        against(f"{over}: import + probe pass vs (a) a bridge booted per checkpoint, per checkpoint (medians, "
                f"{model}, {args.device})", a_m / ours_m, "x", ">=", TARGET_VS_A),
        row(f"{over}: (a) / ours, lowest of the rounds", min(per_round_a), "x"),
        row(f"{over}: (a) / ours, highest of the rounds", max(per_round_a), "x"),
        against(f"{over}: import + probe pass vs (b) one bridge, each checkpoint's weights loaded into it, per "
                f"checkpoint (medians, {model}, {args.device})", b_m / ours_m, "x", ">=", TARGET_VS_B),
        row(f"{over}: (b) / ours, lowest of the rounds", min(per_round_b), "x"),
        row(f"{over}: (b) / ours, highest of the rounds", max(per_round_b), "x"),
    ]
    for name, (m, lo, hi) in (("import + probe pass (ours)", (ours_m, ours_lo, ours_hi)),
                              ("(a) a bridge per checkpoint", (a_m, a_lo, a_hi)),
                              ("(b) one bridge, weights loaded", (b_m, b_lo, b_hi))):
        rows += [row(f"{over}: {name}, per checkpoint, median", m, "s"),
                 row(f"{over}: {name}, per checkpoint, min", lo, "s"),
                 row(f"{over}: {name}, per checkpoint, max", hi, "s")]
    rows += [
        against(f"{shape}: largest difference of the normalised head patching, (a) vs ours", diffs["a"][0], "",
                "<=", TARGET_DIFF),
        against(f"{shape}: largest difference of the normalised head patching, (b) vs ours", diffs["b"][0], "",
                "<=", TARGET_DIFF),
        against(f"{shape}: largest difference of the head scores and loss gap, (a) and (b) vs ours",
                max(diffs["a"][1], diffs["b"][1]), "", "<=", TARGET_DIFF),
        row(f"{shape}: largest difference of the head patching in logits (normalised difference x the clean-corrupted "
            "logit difference), (a) and (b) vs ours", max(diffs["a"][2], diffs["b"][2]), "logits"),
        row(f"{shape}: smallest clean-corrupted logit difference the normalisation divides by",
            min(diffs["a"][3], diffs["b"][3]), "logits"),
        against(f"{shape}: resident memory growth from checkpoint 2 to checkpoint {memory['n']} of the import + "
                "probe pass", 100 * (rss_n - rss2) / rss2, "%", "<=", TARGET_RSS_GROWTH, "%"),
        row(f"{shape}: resident memory at checkpoint 2 of the import + probe pass", rss2, "MiB"),
        row(f"{shape}: resident memory at checkpoint {memory['n']} of the import + probe pass", rss_n, "MiB"),
        row(f"{shape}: import + probe pass over {memory['n']} checkpoints (the memory pass, once), per checkpoint",
            memory["seconds"] / memory["n"], "s"),
    ]
    if analyze_s is not None:
        rows.append(row(f"{shape}: import + the whole analyze (analyze_series, the CLI's defaults) over {analyze_n} "
                        "checkpoints, every one a landmark of the expensive pass, per checkpoint", analyze_s, "s"))
    per_checkpoint = memory["seconds"] / memory["n"]
    rows += [row(f"{shape}: projected import + probe pass over Pythia's {PYTHIA_CHECKPOINTS} checkpoints (per "
                 f"checkpoint of the {memory['n']}-checkpoint pass x {PYTHIA_CHECKPOINTS})",
                 per_checkpoint * PYTHIA_CHECKPOINTS / 60, "min"),
             row(f"{shape}: projected (a) over {PYTHIA_CHECKPOINTS} checkpoints (its median x {PYTHIA_CHECKPOINTS})",
                 a_m * PYTHIA_CHECKPOINTS / 60, "min"),
             row(f"{shape}: projected (b) over {PYTHIA_CHECKPOINTS} checkpoints (its median x {PYTHIA_CHECKPOINTS})",
                 b_m * PYTHIA_CHECKPOINTS / 60, "min"),
             row(f"{shape}: disk used by the series (float32 safetensors, deleted after)", disk / 1e9, "GB"),
             row(f"{shape}: disk per checkpoint", disk / len(steps) / 1e6, "MB"),
             row(f"{shape}: the bench's wall time", (time.perf_counter() - wall) / 60, "min")]
    print_rows(rows)
    for note in notes:
        print(f"note: {note}")
    settings = arguments(args, timed=timed_n, analyze=analyze_n, n_pairs=N_PAIRS, segment_len=SEGMENT,
                         notes=notes)
    print(f"saved {save('import_series', rows, settings, part=None if shape == 'small' else shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
