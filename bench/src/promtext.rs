//! Reading the collector's `/metrics`: the Prometheus text exposition parser of
//! `uctel-testkit`, the same one every test reads the daemons with, so the bench and the
//! tests cannot disagree on what a scrape says. A scrape that does not parse is an error
//! ([`crate::daemon::DaemonError::Scrape`]), never a silently shorter sum.

pub use uctel_testkit::exposition::{ParseError, Sample, Scrape};
