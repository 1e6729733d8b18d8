"""The rule author's tools: ``traceanalyzer rules`` (list, explain, new, test), the scaffold
``rules new`` writes, the fixture runner and the generated rule docs."""
