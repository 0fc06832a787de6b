"""The catalogue of named sweeps (``plateauscope sweep --list``): each a :class:`~plateauscope.sweeps.spec.SweepSpec` with its cost in steps."""

from __future__ import annotations

from plateauscope.errors import ConfigError
from plateauscope.sweeps.spec import SweepSpec

# The `quick` grids use the `ci` model (2 layers, d_model 64; about 20 ms a step on 2 cores, tau
# about 500 steps at D = 3,000, 1,000 at 5,000 and 2,900 at 10,000 with K = 10), evaluate every
# 25 steps, checkpoint every 50 and stop at 1.4 tau: the plateau and the drop are in every run.
# Exact-match accuracy lags the candidate loss (at 1.4 tau a group is rarely >= 80% exact), so
# the snap *window* needs longer runs (--set stop_after_tau=3); the share at tau/2 does not.
_QUICK = {"stop_after_tau": 1.4, "eval_every": 25, "ckpt_every": 50, "max_steps": 6000}
# The `paper` grids use the paper's model (4 layers, d_model 128; about 85 ms a step on 2 cores,
# tau about 1,400 steps at D = 10,000), evaluate every 50 steps and stop at 1.5 tau.
_PAPER = {"stop_after_tau": 1.5, "eval_every": 50, "ckpt_every": 50, "tracked_groups": 200}
# Seed ensembles of one preset: model seed and data seed varied together (seed i with data seed i).
_SEEDS = tuple({"seed": (i,), "data_seed": (i,)} for i in range(5))
_K_D_QUICK = 5040  # a multiple of 3, 10 and 36: the same D for every K
_K_D_PAPER = 10080

# The marginal search (issue 11): the `ci` model on D = 5,000 (n_b 500, K 10), evaluated every 25
# steps, stopped at 1.3 tau or at 3,000 steps (the no-z control never reaches tau: its 3,000 steps
# show how long the marginal alone takes; ci's own tau is ~1,000 steps). Cost: at most 30 x 3,000 =
# 90k steps; the ci model takes ~20 ms a step on a quiet core plus ~15% for evaluation every 25
# steps, so <= ~35 min with 2 workers (--ensemble: one vectorised job per variant, less). Measured
# on a loaded machine (load ~10 on 2 cores): 400 steps in 96-142 s of run wall time. Cut to fit 60
# minutes on 2 cores: the `ci` model only (the paper model is left to a variant that shows a
# marginal stage), D = 5,000 and K = 10 only, 3 seeds, 3,000 steps at most, checkpoints every 50
# steps, and only the pairs that test a hypothesis of their own (a_len 1 with zb; a_len 1 without
# z; tails by first character with zb) - not every pair of the five knobs.
_MARGINAL = {"stop_after_tau": 1.3, "eval_every": 25, "ckpt_every": 50, "max_steps": 3000, "tracked_groups": 50}
_MARGINAL_VARIANTS: tuple[dict[str, tuple], ...] = (
    {"a_len": (4,)},  # the paper's task (a_len 4 is its default): the shelf the issue starts from
    # Short targets: is the marginal over 4-character strings what costs the time?
    {"a_len": (1,), "target_uniqueness": ("group",)},
    {"a_len": (2,), "target_uniqueness": ("group",)},
    # Tails as a global function of the first character: 36 tail facts instead of D.
    {"tails": ("by_first_char",), "target_uniqueness": ("group",)},
    # z before B: the selector cannot be read at the answer with B's help before B arrives.
    {"order": ("zb",)},
    {"a_len": (1,), "target_uniqueness": ("group",), "order": ("zb",)},
    {"tails": ("by_first_char",), "target_uniqueness": ("group",), "order": ("zb",)},
    # Private selectors: z is no longer one shared code; the conditional costs D facts like the marginal.
    {"selectors": ("private",)},
    # The (B) -> A control: the price of the marginal alone.
    {"no_z": (True,)},
    {"no_z": (True,), "a_len": (1,), "target_uniqueness": ("group",)},
)

# The second search (issue 20): the same ci setting, variants whose marginal is carried by a cheap,
# shared feature. A pool of M targets makes the global marginal uniform over M strings (worth
# log(36^4 / M) nats of set loss); Zipf first characters make the first character's marginal worth
# learning. The pool's draws may share a first character, so its control is the paper's task with
# that option too.
_MARGINAL_VARIANTS_2: tuple[dict[str, tuple], ...] = (
    {"distinct_first_char": (False,)},  # the control: the paper's task, first characters may repeat
    *({"target_pool": (m,), "target_uniqueness": ("group",), "distinct_first_char": (False,)} for m in (20, 50, 200)),
    {"first_char_zipf": (1.0,)},
)


def _intervention_grids(seeds: range, hide_at: tuple[float, ...], only_heads: tuple[str, ...]
                        ) -> tuple[dict[str, tuple], ...]:
    """Per seed (model and data seed together): the unmodified run and each intervention relative to it.
    Ordered by cost over all seeds, so a sweep stopped early has the sharpest contrast over every
    seed: the unmodified runs, the embeddings and layer 0 or the readout given (the shortest runs), layer 0
    given frozen, the hidden cue (the longest: many never reach tau), then the single routes."""
    seeds_of = [{"seed": (i,), "data_seed": (i,)} for i in seeds]
    grids = [*seeds_of, *({**s, "transplant": ("routing", "readout")} for s in seeds_of),
             *({**s, "transplant": ("routing",), "freeze_transplant": (True,)} for s in seeds_of),
             *({**s, "hide_cue_at": hide_at} for s in seeds_of)]
    grids += [{**s, "only_head": only_heads} for s in seeds_of if only_heads]
    return tuple(grids)


# The paper's noise grid (issue 20): the demo model on the paper's data (n_b 1,000, K 10), batch sizes at
# lr 1e-3 and learning rates at batch 128, 3 seeds (model and data seed together), stopped at 1.3 tau.
# Seed ensembles do not pay on a CPU (plateauscope.training.ensemble: an ensemble step costs the members' solo
# steps), so the runs train as solo jobs, two at a time on one thread each. Evaluation every 50 steps
# reads tau to 50 steps (1-3% of tau).
_NOISE_GRID = {"stop_after_tau": 1.3, "eval_every": 50, "ckpt_every": 100, "max_steps": 12000}


def _noise_grids(seeds: range, batches: tuple[int, ...], lrs: tuple[float, ...]) -> tuple[dict[str, tuple], ...]:
    """The batch sizes at the first learning rate and the other learning rates at the first batch size
    (the centre point, first in both, trains once), ordered so that a sweep stopped early has the most
    to say: the centre and the extreme values over the first two seeds, then the middle values over
    those seeds, then the other seeds."""
    def ends(xs: tuple) -> tuple:
        return tuple(x for x in xs if x in (min(xs), max(xs)))

    def blocks(seed: int, bs: tuple, lr: tuple) -> list[dict[str, tuple]]:
        s = {"seed": (seed,), "data_seed": (seed,)}
        return [{"batch_size": bs, "lr": lrs[:1], **s}, {"batch_size": batches[:1], "lr": lr, **s}]

    outer = (batches[:1] + ends(batches[1:]), ends(lrs[1:]))
    middle = (tuple(b for b in batches[1:] if b not in outer[0]), tuple(x for x in lrs[1:] if x not in outer[1]))
    first, rest = seeds[:2], seeds[2:]
    grids = [g for i in first for g in blocks(i, *outer)] + [g for i in first for g in blocks(i, *middle)]
    grids += [g for i in rest for g in blocks(i, outer[0] + middle[0], outer[1] + middle[1])]
    return tuple(g for g in grids if g["batch_size"] and g["lr"])


# What the plateau waits for (issue 19): each seed's own run, its tau_0 and its last checkpoint (the
# donor, after the drop), then the interventions relative to it. Run as a sweep, the unmodified
# runs train first; their names are those of seeds-ci, so a copy of seeds-ci's runs is reused.
_HIDE_AT = (0.25, 0.5, 0.75, 1.0)


def _clamp_grids(seeds: tuple[dict, ...], heads: tuple[str, ...], strengths: tuple[float, ...], layer: int | None
                 ) -> tuple[dict[str, tuple], ...]:
    """Per seed: the unmodified run, then from step 0 each of its own heads ``heads`` (``clamp_head_of``:
    a rule's top head, or ``routing``) clamped at each strength, and (``layer``) every head of that
    layer clamped to the cue at a = 1."""
    grids = [*seeds, *({**s, "clamp_head_of": heads, "clamp_strength": strengths} for s in seeds)]
    grids += [{**s, "clamp_layer": (layer,), "clamp_strength": (1.0,)} for s in seeds] if layer is not None else []
    return tuple(grids)


_MARGINAL_TINY = {"lr": 3e-3, "stop_after_tau": 1.5, "max_steps": 300, "eval_every": 10, "ckpt_every": 50}
"""The machinery checks of the marginal searches: the 1-layer tiny model, a few hundred steps."""

_MARGINAL_SEARCH = SweepSpec(
    name="marginal-search", base="ci", fixed=_MARGINAL,
    grids=tuple({**variant, "seed": (0, 1, 2)} for variant in _MARGINAL_VARIANTS),
    description="task variants (short A, tails by first character, z before B, private selectors, "
                "the no-z control, and pairs): which plateau - marginal or know-nothing shelf - each has",
    cost="30 runs (10 variants x 3 seeds), 40-90k steps")
_MARGINAL_SEARCH_2 = SweepSpec(
    name="marginal-search-2", base="ci", fixed=_MARGINAL,
    grids=tuple({**variant, "seed": (0, 1, 2)} for variant in _MARGINAL_VARIANTS_2),
    description="task variants with a cheap marginal (a shared pool of M = 20, 50, 200 targets; Zipf "
                "first characters) and their control: is there a marginal stage before the drop?",
    cost="15 runs (5 variants x 3 seeds) of <= 3,000 steps")


def _machinery_check(search: SweepSpec, seeds: tuple[int, ...], cost: str) -> SweepSpec:
    """A marginal search's machinery check: its variants on the 1-layer tiny model for a few hundred steps."""
    return SweepSpec(name=f"{search.name}-tiny", base="tiny", fixed=_MARGINAL_TINY,
                     grids=tuple({**grid, "seed": seeds} for grid in search.grids),
                     description=f"machinery check of {search.name}: the same variants on the 1-layer tiny model, "
                                 f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}", cost=cost)


SWEEPS: dict[str, SweepSpec] = {s.name: s for s in [
    SweepSpec(
        name="quick-k", base="ci", fixed=_QUICK,
        grids=({"K": (3,), "D": (_K_D_QUICK,), "seed": (0, 1, 2)},
               {"K": (10,), "D": (_K_D_QUICK,), "seed": (0, 1, 2)},
               # K = 36 scores 36 x 36 candidates per evaluation group: fewer groups keep evaluation cheap.
               {"K": (36,), "D": (_K_D_QUICK,), "eval_groups": (4,), "seed": (0, 1, 2)}),
        description="tau against K at fixed D = 5,040 (K = 3, 10, 36): the paper finds no dependence",
        cost="~14k steps"),
    SweepSpec(
        name="induction-seeds", base="induction", fixed={},
        grids=({"seed": (0, 1, 2)},),
        description="the induction preset over 3 seeds: tau, the induction and previous-token heads' t_form and lead",
        cost="~2k steps"),
    SweepSpec(
        name="markov-seeds", base="markov", fixed={},
        grids=({"seed": (0, 1, 2)},),
        description="the markov preset over 3 seeds: tau, the stages (uniform, unigram, bigram), the statistical "
                    "induction and previous-token heads' t_form and lead",
        cost="~1.5k steps"),
    SweepSpec(
        name="quick-d", base="ci", fixed=_QUICK,
        grids=({"K": (10,), "D": (2000, 3000, 5000, 8000), "seed": (0, 1, 2)},),
        description="the scaling law tau ~ D^alpha at K = 10 (the paper: alpha = 1.19)",
        cost="~16k steps"),
    SweepSpec(
        name="quick-noise", base="ci", fixed=_QUICK,
        grids=({"D": (3000,), "batch_size": (32, 64, 128, 256), "seed": (0, 1)},
               {"D": (3000,), "lr": (3e-4, 1e-3, 3e-3, 5e-3), "seed": (0, 1)}),
        description="gradient noise: tau in tokens against batch size, tau against learning rate (D = 3,000)",
        cost="~20k steps (small batches are cheap steps)"),
    SweepSpec(
        # 2.5 tau: the backward runs also reach 50% exact match, the metric both directions share.
        name="quick-direction", base="ci", fixed={**_QUICK, "stop_after_tau": 2.5},
        grids=({"D": (2000, 3000), "direction": ("backward", "forward"), "seed": (0, 1)},),
        description="forward A -> B against backward (B, z) -> A at matched D (the paper: forward 1.7-4.4x slower)",
        cost="~15k steps (forward runs may hit max_steps = 6,000)"),
    SweepSpec(
        name="paper-k", base="paper", fixed={**_PAPER, "max_steps": 10000},
        grids=({"K": (3,), "D": (_K_D_PAPER,), "seed": (0, 1, 2, 3, 4)},
               {"K": (10,), "D": (_K_D_PAPER,), "seed": (0, 1, 2, 3, 4)},
               {"K": (36,), "D": (_K_D_PAPER,), "eval_groups": (4,), "seed": (0, 1, 2, 3, 4)}),
        description="the paper's K = 3, 10, 36 at fixed D = 10,080, its model, 5 seeds",
        cost="~32k steps"),
    SweepSpec(
        name="paper-d", base="paper", fixed={**_PAPER, "max_steps": 20000},
        grids=({"K": (10,), "D": (2500, 5000, 10000, 20000, 40000), "seed": (0, 1, 2, 3, 4)},),
        description="the paper's scaling law: a D ladder from 2,500 to 40,000 at K = 10, 5 seeds",
        cost="~100k steps (tau ~ 7,000 at D = 40,000)"),
    SweepSpec(
        name="paper-noise", base="paper", fixed={**_PAPER, "max_steps": 30000},
        grids=({"D": (10000,), "batch_size": (32, 64, 128, 256), "seed": (0, 1, 2)},
               {"D": (10000,), "lr": (3e-4, 1e-3, 2e-3, 3e-3, 5e-3), "seed": (0, 1, 2)}),
        description="the paper's batch sizes (32-256) and learning rates (3e-4 to 5e-3) at D = 10,000, 3 seeds",
        cost="~150k steps (batch 32 needs ~4x the steps of 128)"),
    SweepSpec(
        name="paper-noise-grid", base="demo", fixed=_NOISE_GRID, grids=_noise_grids(range(3), (128, 32, 256, 64), (1e-3, 4e-3, 5e-4, 2e-3)),
        description="the paper's noise claims on the demo model (n_b 1,000, K 10): batch 32-256 at lr 1e-3, "
                    "lr 5e-4 to 4e-3 at batch 128, 3 seeds, stopped at 1.3 tau",
        cost="21 runs of the paper model (7 points x 3 seeds)"),
    SweepSpec(
        name="paper-noise-grid-tiny", base="tiny",
        fixed={"stop_after_tau": 1.3, "max_steps": 1500, "eval_every": 10, "ckpt_every": 50, "D": 160},
        grids=_noise_grids(range(2), (32, 16), (3e-3, 6e-3)),
        description="machinery check of paper-noise-grid: the 1-layer tiny model, batch 16 and 32, lr 3e-3 and 6e-3, 2 seeds",
        cost="6 runs, ~2k steps"),
    SweepSpec(
        name="paper-direction", base="paper", fixed={**_PAPER, "max_steps": 20000},
        grids=({"D": (2500, 5000, 10000), "direction": ("backward", "forward"), "seed": (0, 1, 2)},),
        description="forward A -> B against backward (B, z) -> A at D = 2,500, 5,000 and 10,000, 3 seeds",
        cost="~80k steps (forward up to ~4x backward)"),
    # Each block is one hypothesis about what keeps the marginal from coming first (see _MARGINAL).
    _MARGINAL_SEARCH,
    _machinery_check(_MARGINAL_SEARCH, (0, 1), "20 runs, ~5k steps"),
    _MARGINAL_SEARCH_2,
    _machinery_check(_MARGINAL_SEARCH_2, (0,), "5 runs, ~1.5k steps"),
    SweepSpec(
        name="seeds-ci", base="ci", grids=_SEEDS,
        description="5 seeds of the ci preset (model and data seed varied): the lead and the circuit over seeds",
        cost="5 runs of ~1,300 steps"),
    SweepSpec(
        name="seeds-demo", base="demo", grids=_SEEDS,
        description="5 seeds of the demo preset (model and data seed varied): the lead and the circuit over seeds",
        cost="5 runs of ~2,100 steps (1.5 tau)"),
    SweepSpec(
        name="plateau-interventions", base="ci", fixed={"forward": "trimmed"},
        grids=_intervention_grids(range(5), _HIDE_AT, ("0.0", "0.1", "0.2", "0.3")),
        description="what the plateau waits for: the cue hidden until S = 0.25-1 tau_0, the embeddings and layer 0 "
                    "or the readout given (trained or frozen), one route in layer 0; ci, 5 seeds",
        cost="60 runs (5 unmodified, 55 interventions, ~1-2.5 tau_0 each), 105,425 steps"),
    SweepSpec(
        name="plateau-interventions-demo", base="demo",
        fixed={"forward": "trimmed"},
        grids=_intervention_grids(range(3), (0.5,), ()),
        description="the main contrasts of plateau-interventions on the demo model: the cue hidden until "
                    "0.5 tau_0, the embeddings and layer 0 or the readout given; 3 seeds",
        cost="15 runs of the paper model, 33,200 steps"),
    SweepSpec(
        name="plateau-interventions-tiny", base="tiny",
        fixed={"lr": 3e-3, "stop_after_tau": 1.5, "max_steps": 600, "eval_every": 10, "ckpt_every": 10, "D": 80},
        grids=_intervention_grids(range(2), (0.5, 1.0), ("0.0",)),
        description="machinery check of plateau-interventions on the 1-layer tiny model, 2 seeds",
        cost="14 runs of ~60-300 steps"),
    SweepSpec(
        name="clamps", base="ci", fixed={"forward": "trimmed"},
        grids=_clamp_grids(_SEEDS, ("cue", "routing"), (1.0, 0.5), 0),
        description="where the wait goes: each seed's top head by attention to z, and its routing head (from "
                    "plateauscope analyze of its unmodified run: analyse those, then run the sweep again), clamped "
                    "to z from step 0 at a = 1 and 0.5; every layer-0 head clamped to z; ci, 5 seeds",
        cost="30 runs (5 unmodified, 25 clamped) of <= 3,000 steps"),
    SweepSpec(
        name="clamps-demo", base="demo", fixed={"forward": "trimmed", "checkpoints": "dense", "ckpt_every": 100},
        grids=_clamp_grids(_SEEDS[:3], ("routing",), (1.0,), 0),
        description="the clamps on the demo model: the routing head (from plateauscope analyze of the unmodified "
                    "runs), then every layer-0 head, clamped to z from step 0 at a = 1; 3 seeds",
        cost="9 runs of the paper model"),
    SweepSpec(
        name="clamps-induction", base="induction",
        grids=_clamp_grids(tuple({"seed": (i,)} for i in range(5)), ("previous token",), (1.0,), None),
        description="induction: each seed's previous-token head clamped to the previous token from step 0; 5 seeds",
        cost="10 runs of ~500 steps"),
    SweepSpec(
        name="clamps-tiny", base="tiny",
        fixed={"lr": 3e-3, "stop_after_tau": 1.5, "max_steps": 600, "eval_every": 10, "ckpt_every": 10, "D": 80},
        grids=_clamp_grids(_SEEDS[:2], ("cue",), (1.0,), 0),
        description="machinery check of clamps on the 1-layer tiny model, 2 seeds",
        cost="6 runs of ~60-300 steps"),
    SweepSpec(
        name="tiny", base="tiny",
        fixed={"lr": 3e-3, "stop_after_tau": 1.5, "max_steps": 600, "eval_every": 10, "ckpt_every": 10},
        grids=({"D": (80, 160, 320), "seed": (0, 1)},),
        description="machinery check: a 1-layer d_model 32 model whose tau (~60-350 steps) still grows with D",
        cost="~1.5k steps"),
]}


def get_sweep(name: str) -> SweepSpec:
    """The named shipped sweep, or a one-line ConfigError naming the choices."""
    if name not in SWEEPS:
        raise ConfigError(f"unknown sweep preset {name!r}; choose one of {', '.join(SWEEPS)}")
    return SWEEPS[name]


# ---- command line -------------------------------------------------------------------------
