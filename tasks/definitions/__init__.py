"""What the events are and what is computed from them, in plain Python: the events contract,
every feature's declaration and its formula over per-customer aggregates. Every engine computes
from these one definitions: Spark and DuckDB through the SQL of :mod:`tasks.data.feature_sql`,
the real-time endpoint through its online state (:mod:`serving.online`)."""
