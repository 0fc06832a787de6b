"""Run directories: one shape whatever made them. A run's config (``config``, which names its task), its
files and how they are written (``files``), reading one back (``run``: :class:`plateauscope.runs.run.Run`),
the presets (``presets``), tau, the plateau and the summary from its metrics (``metrics``), the ladder of
reference predictors (``references``), the interventions it was trained with (``interventions``) and the
machines that trained it (``machine``); an imported series read as a run (``imported``). Training writes run
directories; the analyses read them."""

from plateauscope.runs.imported import ImportedRun as _ImportedRun  # noqa: F401  (registers it: Run(path) returns one)
