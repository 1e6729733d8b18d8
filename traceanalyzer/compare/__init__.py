"""Run-to-run comparison (``traceanalyzer diff``): findings new / resolved / changed, and the
rules' key figures per rank, between two runs. It reads what ``run`` wrote (findings.json and
the store), so it sits above the reports, beside the pipeline that produces them.
"""
