"""``traceanalyzer query OUT "SQL"``: DuckDB SQL over a run's store, read-only.

Each store table is a view named like it (``slices``, ``kernels``, ``summary_steps``, ...),
over its Parquet partitions, with the Hive partition keys ``rank`` and ``session`` as columns
(:mod:`.store_sql`); a result is printed or written as a table, CSV, JSON or Parquet
(:mod:`.formats`).
"""
