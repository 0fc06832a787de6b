"""The paper's dynamics from a sweep directory: one row per run, and the fits across runs.

    plateauscope dynamics --sweep DIR [--analyze [--every 10]] [--csv FILE] [--report]

(the command, the figures and the page are ``plateauscope.views.sweep_report`` and ``plateauscope.views.sweep_figures``;
this module computes).

The table (``DIR/dynamics.csv`` and printed) has one row per run: its options, tau at the
thresholds 0.3 / 0.5 / 0.7 log K, tau in tokens, the plateau's longest in-band stretch, the lead fraction (when
``plateauscope analyze`` was run on it) and the collective-snap statistics. The fits, all
on log-log axes and all over the runs of one *family* (the runs that share every factor -
direction, preset, D, K, learning rate, batch size - except the one that varies and the seed;
the largest such family is used):

* scaling law: ``log tau = log c + alpha log D``, least squares over runs; alpha's 95% interval
  is the least-squares t interval (n - 2 degrees of freedom; none with fewer than 3 runs). The
  paper reports alpha = 1.19 (its code's fit: 1.194 [1.137, 1.308]).
* K-independence: the same fit with K in place of D at fixed D (slope ~0 in the paper).
* noise: mean tau *in tokens* (step x batch size x target tokens) and in steps per batch size, as a
  ratio to the largest batch (the paper: the smallest batch is 1.8x slower in tokens), and mean tau
  in steps per learning rate as a ratio to the smallest (the paper: monotone, up to 3.6x slower);
  ``trend`` says whether the means rise or fall monotonically with the factor. The means are
  geometric means over seeds; each has a t interval on logs and each ratio Welch's t interval on
  the log ratio (95% from 3 seeds up, the range of 2 seeds below: ``plateauscope.analysis.intervals``);
  ``plateauscope.dynamics.noise`` reads the paper's claims from them.
* collective snap, per run from the tracked groups' accuracies (``plateauscope.analysis.snap.snap_statistics``):
  the share of groups >= 80% accurate at tau/2 (the paper: 0 of 200) and the median snap
  window in units of tau (the paper: about 0.5); totals over the backward runs.
* directional asymmetry: mean tau(forward A -> B) / mean tau(backward (B, z) -> A) for runs
  that differ only in direction. The two directions' own taus measure different things
  (candidate loss below 0.5 log K; exact-match accuracy above 50%), so the ratio is also
  given on one metric for both: the first step with exact-match accuracy above 50%
  (``t_acc50``). A forward run that never gets there makes the ratio a lower bound
  (its final step stands in, marked ``>=``). The paper: 1.7x to 4.4x.

* plateau kind, per task variant (``variant_table``, ``DIR/variants.csv``): one row per task
  variant (``TaskConfig.variant_label``) and model, over its seeds: the verdicts (``marginal``,
  ``global marginal``, ``shelf``, ``mixed``: ``plateauscope.runs.metrics.plateau_verdict``), the plateau's
  median set loss and the variant's exact global-marginal reference, t_marginal (the first evaluated
  step with set loss < 0.1 log K), tau, t_marginal / tau, the plateau's share of tau, the plateau's
  median first-token set loss (with its global-marginal reference), and whether every seed has a
  *true marginal stage*: set loss below 0.1 log K while the candidate loss stays within 10% of
  log K, for at least 30% of tau; and the same test with the global marginal's threshold in place
  of 0.1 log K (where the global marginal is a kind of its own). Each number is the mean over seeds
  with the seed range [min, max]. A t_marginal / tau below 1 means the marginal came first.
* seeds (:func:`seed_summary`), over the runs analysed by ``plateauscope analyze`` (or
  ``--analyze``, which analyses every run of the sweep first): the median lead fraction by each
  t_form rule of ``plateauscope.analysis.formation`` (``attention``, ``patch_share``, ``cue_effect``) with
  the order-statistic interval of the median and the coverage it has at that n (75% at 3 runs), the
  selector head per seed and how many are in layer 0, and the circuit verdict
  per seed (``plateauscope.analysis.circuit``). All runs of the sweep are pooled: run it on one configuration
  over seeds (``plateauscope sweep --preset seeds-ci``).

Every fit is repeated with tau at the thresholds 0.3 and 0.7 log K (``sensitivity``), to show
how much a conclusion depends on where tau is read off. Signs: alpha > 0 means larger data
sets wait longer; a ratio > 1 means the named condition is slower.
"""
