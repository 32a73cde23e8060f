//! uctel end-to-end tests: see `tests/` (the Cargo integration tests of this crate).
