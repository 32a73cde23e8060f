-- The table of uctel-collector's ClickHouse log output (`outputs.clickhouse`): one row per
-- log record, one column per field of the collector's JSON Lines sink (`logs.sink: file`).
--
--   clickhouse-client --multiquery < logs.sql         (or: uctel-collector --print-clickhouse-schema)
--
-- Works on ClickHouse 18.16 and later. `ts` is the record's time in whole seconds (DateTime;
-- 18.16 has no DateTime64), `ts_ns` the same instant in nanoseconds since the Unix epoch;
-- the JSON Lines `ts` string is `ts_ns` written as RFC 3339. `fields` holds the record's
-- key/value fields sorted by key, as in the JSON object (`fields.value[i]` is the value of `fields.key[i]`).
-- Another table name: change it here and set `outputs.clickhouse.table`.
CREATE TABLE IF NOT EXISTS logs
(
    ts DateTime,
    ts_ns UInt64,
    agent String,
    instance String,
    stream String,
    stream_seq UInt64,
    severity String,
    source String,
    message String,
    fields Nested(key String, value String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (agent, ts);
