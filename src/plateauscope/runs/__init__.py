"""Run directories: one shape whatever made them. A run's config (``config``, which names its task), its
files and how they are written (``files``), reading one back (``run``: :class:`plateauscope.runs.run.Run`),
the presets (``presets``), tau, the plateau and the summary from its metrics (``metrics``), the ladder of
reference predictors (``references``), the interventions it was trained with (``interventions``) and the
machines that trained it (``machine``). Training writes run directories; the analyses read them."""
