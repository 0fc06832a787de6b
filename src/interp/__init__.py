"""The project's first command, kept as an alias: ``python -m interp.patch --ckpt CKPT`` runs ``plateauscope patch``.

Everything else lives in :mod:`plateauscope`."""
