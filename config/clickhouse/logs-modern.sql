-- The table of uctel-collector's ClickHouse log output (`outputs.clickhouse`) for a current
-- ClickHouse (22.3 LTS and later; checked on 26.9):
--
--   clickhouse-client --multiquery < logs-modern.sql
--   (or: uctel-collector --print-clickhouse-schema --server-version 26)
--
-- The same columns as logs.sql, filled from the same rows (the collector sends the same
-- INSERT to both), plus:
-- * `time`, the record's instant to the nanosecond (DateTime64(9), UTC), computed by the
--   server from `ts_ns` (MATERIALIZED: not sent, not returned by `SELECT *`);
-- * LowCardinality for the columns with few distinct values (agent, instance, stream,
--   severity, source, field keys);
-- * a TTL: rows older than 30 days are deleted at merges, and rows already older than that
--   when inserted are not stored at all (change the interval to your retention);
-- * `non_replicated_deduplication_window`: the server keeps the hashes of the last 1000
--   inserted blocks and ignores a block inserted again with the same rows, so an INSERT
--   the collector sends twice (after an answer that never came) is stored once even
--   without the collector's own check.
-- Another table name: change it here and set `outputs.clickhouse.table`.
CREATE TABLE IF NOT EXISTS logs
(
    ts DateTime('UTC'),
    ts_ns UInt64,
    time DateTime64(9, 'UTC') MATERIALIZED fromUnixTimestamp64Nano(toInt64(ts_ns), 'UTC'),
    agent LowCardinality(String),
    instance LowCardinality(String),
    stream LowCardinality(String),
    stream_seq UInt64,
    severity LowCardinality(String),
    source LowCardinality(String),
    message String,
    fields Nested(key LowCardinality(String), value String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (agent, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;
