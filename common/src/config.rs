//! Strict YAML configuration loading that reports **every** problem at once, each with file,
//! line, column and key path (DESIGN.md §9).
//!
//! serde stops at the first error, so loading runs in rounds:
//!
//! 1. The text is parsed into a [`serde_yaml::Value`] (YAML through `serde_norway`). A syntax
//!    error ends loading with that one problem (its location comes from the YAML parser). Of
//!    keys repeated in one mapping (which serde_norway refuses at the first one) the first is
//!    kept and the others are skipped, so the rest of the file is still checked.
//! 2. A second, location-aware pass over the same text (`saphyr-parser` events) records where
//!    every key and value starts, indexed by key path (`listen.control`, `auth.agents[1].id`),
//!    and finds every repeated key, nested mappings included: each is one problem at its own
//!    line and column, `a: duplicate key (first at 1:1)`. Keys are compared as serde_norway
//!    compares them (`~` and `null` are the same key, `1` and `'1'` are not).
//! 3. The value is deserialized into `T` through `serde_path_to_error`, which names the key
//!    path of the failure. The problem is recorded, the offending key is removed from the value
//!    (unknown key, wrong type, bad value) or a neutral placeholder is put in for a missing one,
//!    and the next round runs, until `T` deserializes or [`MAX_ROUNDS`] is reached.
//! 4. [`Validate::validate`] runs the semantic checks (ranges, cross-field rules, files that
//!    must exist or be creatable) on the value that finally deserialized, even when earlier
//!    rounds found problems, so a file with four mistakes reports four: the checks see the
//!    offending keys at their defaults, and a semantic problem about a key (or a section
//!    around or inside it) that already has a problem is left out. Key paths map to lines
//!    the same way.
//!
//! Messages are in words for operators: `expected a whole number from 0 to 65535, found
//! 99999` rather than serde's `invalid value: integer 99999, expected u16`; an unknown key
//! says which key was probably meant (`unknown key; did you mean transport.soft.fault?`),
//! from the keys of its section or from [`Validate::renamed_keys`] for keys that moved.
//!
//! # Layout
//!
//! - `load`: [`load()`] and [`from_str`], the rounds above.
//! - `locations`: where each key path is in the text, and the repeated keys (step 2).
//! - `keypath`: key paths as segments, and the edits of the value at a path the rounds make.
//! - `words`: serde's messages in words, and the key an unknown key probably meant.
//! - `error`: [`Problem`], [`ConfigError`] and [`check_startup`].
//! - `validate`: [`Validate`] and [`Problems`].
//! - `files`: [`check_directory`] and [`check_writable_file`], for `Validate` implementations.
//! - `fault`: [`FaultSection`], the `transport.soft.fault` section both daemons share.
//! - [`reference`](mod@reference): the configuration reference generated from the config types.
//!
//! Config types should use `#[serde(deny_unknown_fields)]`, unit-suffixed keys
//! (`interval_seconds`, `max_frame_bytes`) and avoid `#[serde(flatten)]` and internally tagged
//! enums (both buffer the input, which loses key paths and disables `deny_unknown_fields`).
//!
//! ```
//! use serde::Deserialize;
//! use uctel_common::config::{self, Problems, Validate};
//!
//! #[derive(Debug, Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Example {
//!     port: u16,
//!     #[serde(default)]
//!     slots: u32,
//! }
//! impl Validate for Example {
//!     fn validate(&self, problems: &mut Problems) {
//!         if self.slots == 1 {
//!             problems.push("slots", "must be 0 or at least 2");
//!         }
//!     }
//! }
//!
//! let err = config::from_str::<Example>("example.yaml", "port: 99999\nbogus: 1\n").unwrap_err();
//! let text = err.to_string();
//! assert!(
//!     text.contains("example.yaml:1:7: port: expected a whole number from 0 to 65535, found 99999"),
//!     "{text}"
//! );
//! assert!(
//!     text.contains("example.yaml:2:1: bogus: unknown key; the keys here are port, slots"),
//!     "{text}"
//! );
//! ```

mod error;
mod fault;
mod files;
mod keypath;
mod load;
mod locations;
pub mod reference;
mod validate;
mod words;

pub use error::{check_startup, ConfigError, Problem};
pub use fault::{FaultDirection, FaultSection, RENAMED_SOFT_KEYS};
pub use files::{check_directory, check_writable_file};
pub use load::{from_str, from_str_with, load, load_with, MAX_ROUNDS};
pub use validate::{Problems, Validate};

/// The text of the module that defines [`FaultSection`], for [`reference`](mod@reference): its doc comments
/// are the descriptions of `transport.soft.fault.*` in both daemons' references.
pub const SOURCE: &str = include_str!("config/fault.rs");
