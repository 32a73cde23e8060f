//! Fault-matrix rows of a reload that changes the collector's ClickHouse output, through the
//! real `uctel-collector` and `uctel-agent` binaries and a real ClickHouse server.
//!
//! - `reload_under_load_moves_clickhouse_to_another_table`: log lines flow into the table
//!   `logs`; a `SIGHUP` moves the output to the table `logs_after` while bursts are still
//!   arriving. Every line the agent wrote is a row of exactly one of the two tables, or
//!   counted dropped by the output (`reason="reload"` among them); no line is in both, or
//!   twice in one; both tables got rows (the switch came mid-stream); the output's sum rule
//!   holds; one session from start to end.

use uctel_tests::exclusive;
use uctel_tests::faults::{AgentSpec, Law, Row};

use super::{
    clickhouse_drained, clickhouse_output, clickhouse_with_shipped_schema, reload_collector_output,
    GAP, SETTLE,
};

#[test]
fn reload_under_load_moves_clickhouse_to_another_table() {
    let _g = exclusive();
    let ch = clickhouse_with_shipped_schema();
    ch.query("CREATE TABLE logs_after AS logs")
        .unwrap_or_else(|e| panic!("{e}"));
    let spec = clickhouse_output(&ch, 200, &[]);
    let mut row = Row::start("reload-moves-clickhouse", spec, None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 1500, GAP);
    // A burst the reload lands in the middle of.
    row.write(a, 0, 3000);

    reload_collector_output(&mut row, "outputs.clickhouse.table", "logs_after");
    row.write_bursts(a, 0, 1500, GAP);
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    row.quiesce();
    let s = clickhouse_drained(&mut row);
    let id = row.agents[a].spec.id.clone();
    let count = |sql: &str| -> u64 {
        ch.query(sql)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    };
    let before = count(&format!("SELECT count() FROM logs WHERE agent = '{id}'"));
    let after = count(&format!(
        "SELECT count() FROM logs_after WHERE agent = '{id}'"
    ));
    let distinct = count(&format!(
        "SELECT uniqExact(message) FROM (SELECT message FROM logs WHERE agent = '{id}' \
         UNION ALL SELECT message FROM logs_after WHERE agent = '{id}')"
    ));
    let input = s.count("uctel_collector_clickhouse_rows_in_total", &[]);
    let inserted = s.count("uctel_collector_clickhouse_rows_inserted_total", &[]);
    let dropped = s.count("uctel_collector_clickhouse_rows_dropped_total", &[]);
    let at_reload = s.count(
        "uctel_collector_clickhouse_rows_dropped_total",
        &[("reason", "reload")],
    );
    let pending = s.count("uctel_collector_clickhouse_rows_pending", &[]);
    row.notes.push(format!(
        "clickhouse: written {written}; rows in `logs` {before}, in `logs_after` {after}, \
         distinct {distinct}; output in {input}, inserted {inserted}, dropped {dropped} \
         (reload {at_reload}), pending {pending}"
    ));
    row.expect(
        before > 0 && after > 0,
        format!("both tables got rows ({before}, {after}): the switch came mid-stream"),
    );
    row.expect(
        before + after == distinct,
        format!(
            "no line in both tables or twice in one ({before} + {after} rows, {distinct} distinct)"
        ),
    );
    row.expect(
        distinct + dropped == written,
        format!("{written} lines written = {distinct} rows + {dropped} dropped"),
    );
    row.expect(
        input == inserted + dropped + pending,
        format!("in {input} = inserted {inserted} + dropped {dropped} + pending {pending}"),
    );
    let reconnects = row.agent_last(a).count("uctel_agent_reconnects_total", &[]);
    let sessions = uctel_tests::faults::welcomed_sessions(&row.collector.log(), "a");
    row.expect(
        sessions == 1 && reconnects == 0,
        format!("sessions of agent a: {sessions} (want 1), reconnects {reconnects} (want 0)"),
    );
    row.verdict(Law::Exact);
}
