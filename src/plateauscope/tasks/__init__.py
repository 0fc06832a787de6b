"""Tasks: the protocol every part of training and ``interp`` asks (``base``), the built-in tasks
(``selector``, the (B, z) -> A wind tunnel with its layout and metrics; ``induction``; ``markov``;
``grokking``, modular addition with a held-out split), and finding
a task by name or in a file of one's own (``loading``)."""
