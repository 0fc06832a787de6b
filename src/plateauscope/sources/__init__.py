"""Reading checkpoint series written elsewhere into an imported run directory (``plateauscope import``).

* :mod:`plateauscope.sources.hf_folder`: a folder of Hugging Face checkpoints (the Trainer's ``checkpoint-N/``);
* :mod:`plateauscope.sources.nanogpt`: nanoGPT ``ckpt.pt`` files (GPT-2 layout);
* :mod:`plateauscope.sources.hf_cache`: step revisions in the local Hugging Face cache (``hf-cache:ORG/NAME``);
* :mod:`plateauscope.sources.hf_hub`: step revisions on the Hugging Face hub (``hf:ORG/NAME``), fetched by ``analyze``;
* :mod:`plateauscope.sources.tl_checkpoint`: TransformerLens state dicts of a GPT-2-style model, with ``cfg.json``;
* :mod:`plateauscope.sources.selection`: which steps (``--every``, ``--steps``, ``--log-spaced``);
* :mod:`plateauscope.sources.importer`: the import itself (hashes, checks, the manifest).

The run directory's layout and the loading of its checkpoints are :mod:`plateauscope.runs.series`.
"""
