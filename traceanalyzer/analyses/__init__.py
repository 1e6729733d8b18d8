"""What the rules (through :mod:`traceanalyzer.kit`) and the overview conclude from the store's
tables, each analysis once: steps, phases and host call sites for rules (``steps``), the window
a finding's cost is a share of (``cost``), the canned requirements (``requirements``), device
memory for rules (``memory``), the ranks' collectives aligned across their group
(``cross_rank``), tail iterations and their root (``tails``), and the expert load of MoE layers
(``moe``).

They read the ingested and derived tables (:mod:`traceanalyzer.derived`,
:mod:`traceanalyzer.memory`) and sit below the kit, which re-exports them, and the overview,
which reads what it shares with the rules from here rather than from the kit.
"""
