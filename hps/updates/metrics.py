"""Prometheus metrics of the update path (``hps consume --metrics-port`` serves them)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CONSUMER_LAG = Gauge(
    "hps_updates_consumer_lag",
    "Messages published but not yet applied, per assigned partition",
    ["topic", "partition"],
)
APPLIED_ROWS = Counter("hps_updates_applied_rows_total", "Rows applied to L2/L3", ["table", "kind"])
STALE_ROWS = Counter(
    "hps_updates_stale_rows_total", "Rows skipped because a newer version was applied", ["table"]
)
MESSAGES = Counter("hps_updates_messages_total", "Update messages consumed", ["format"])
DEAD_LETTERS = Counter(
    "hps_updates_dead_letters_total", "Messages sent to the dead-letter topic", ["reason"]
)
FAILURES = Counter(
    "hps_updates_apply_failures_total", "Batch applications that failed and were retried"
)
BATCH_SECONDS = Histogram(
    "hps_updates_batch_seconds",
    "Time to apply one batch to L2 and L3 (durably)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
L1_REFRESHED = Counter(
    "hps_updates_l1_refreshed_keys_total", "Keys whose L1 rows an update refreshed", ["table"]
)
