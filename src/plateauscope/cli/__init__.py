"""``plateauscope <verb>``: one command, one module per verb (:data:`VERBS`).

Each verb module has ``build_parser()`` and ``main(argv) -> int``; the shared options and the one
error path (one line on stderr, exit code 2, before any progress bar) are in :mod:`plateauscope.cli.common`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys

VERBS: dict[str, str] = {
    "train": "train one run (a preset, a task of your own, or a seed ensemble)",
    "sweep": "train a named grid of runs into one directory (local pool, submitit or Slurm)",
    "analyze": "analyse a run's checkpoint series into its cache (attention, patching, edges, circuit)",
    "patch": "activation patching at one checkpoint (heads, residual stream, attention, MLP)",
    "ablate": "ablate each head at one checkpoint",
    "attention": "attention to the task's cue per head at one checkpoint",
    "report": "write a run's HTML report from its analysis cache",
    "view": "write a run's time view: the circuit moving through training, one offline page",
    "dynamics": "a sweep's per-run table, the fits across runs and its page",
    "hessian": "plateau geometry: the Hessian's top and bottom eigenvalues at checkpoints",
    "verify": "check a run's checkpoints and resume states against their SHA-256 checksums",
    "graft": "graft bisection: the earliest checkpoint whose part, grafted into step 0, shortens the plateau",
    "llc": "the local learning coefficient over a run's checkpoints (the llc extra)",
    "moved_first": "which signal moved first: one change-point rule for every signal of a run, or over a sweep's seeds",
    "import": "import a checkpoint series trained elsewhere (Hugging Face, nanoGPT) as a run directory",
    "demo": "train, analyse, report and view the demo run (the paper's model and data)",
}
"""Verb -> its one-line summary; the verb's module is ``plateauscope.cli.<verb>`` (``import_`` for ``import``)."""


SPIN_COUNT = "500"
"""How long a torch (OpenMP) thread that waits at a barrier spins before it sleeps (``GOMP_SPINCOUNT``), unless
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is in the environment. OpenMP's own default spins for a long while: beside
another busy process (``analyze --follow`` beside ``train``, a sweep's other jobs) the spinning thread holds the core
the descheduled one needs, and two threads run twice as slow as one. Sleeping at once (``OMP_WAIT_POLICY=PASSIVE``)
avoids that but costs a fifth of a small model's step when the machine is free; a short spin costs neither
(``bench/threads.py``). Waiting changes no number."""


def usage() -> str:
    """``plateauscope --help``: the verbs, one line each."""
    width = max(map(len, VERBS))
    lines = ["usage: plateauscope <verb> [options]   (plateauscope <verb> --help for a verb's options)", "",
             "Watch a transformer learn through a plateau, and explain why it waits.", "", "verbs:"]
    lines += [f"  {verb.ljust(width)}  {summary}" for verb, summary in VERBS.items()]
    return "\n".join(lines)


def verb_module(verb: str):
    """The module of one verb (imported only when that verb runs)."""
    return importlib.import_module(f"plateauscope.cli.{verb}_" if verb == "import" else f"plateauscope.cli.{verb}")


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``plateauscope <verb> ...`` to the verb's ``main``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        print(f"plateauscope {importlib.metadata.version('plateauscope')}")
        return 0
    verb, rest = argv[0], argv[1:]
    if not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ):  # read when torch loads OpenMP: before any verb
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    from plateauscope.processes import limit_malloc_arenas

    limit_malloc_arenas()
    if verb not in VERBS:
        print(f"error: unknown verb {verb!r}; choose one of {', '.join(VERBS)} (plateauscope --help)", file=sys.stderr)
        return 2
    return verb_module(verb).main(rest)
