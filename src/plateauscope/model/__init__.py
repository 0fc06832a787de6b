"""The ground floor: the model and its forwards, owned by neither training nor analysis.

The TransformerLens backend (``backend``: the one module that imports a TransformerLens model class), the
configs of the model and of training (``config``), the fused and hooked forwards (``fused``,
``hooked_forward``), scoring on shared prefixes (``scoring``), the loss (``loss``), head names (``heads``),
and the structural types it asks of the layers above (``protocols``). It imports nothing of the project
above it and knows no task."""
