//! `uctel-collector`: coming with the collector issue.
