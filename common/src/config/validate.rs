//! The semantic checks a configuration type adds to what serde checks: the [`Validate`] trait
//! and the [`Problems`] it fills.

use std::fmt;

/// Semantic problems collected by [`Validate::validate`], each naming a key path.
#[derive(Debug, Default)]
pub struct Problems {
    pub(super) items: Vec<(String, String)>,
}

impl Problems {
    /// Records that the value at `key_path` (dotted, `[i]` for sequence items) is wrong.
    pub fn push(&mut self, key_path: impl Into<String>, message: impl fmt::Display) {
        self.items.push((key_path.into(), message.to_string()));
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The recorded `(key_path, message)` pairs.
    pub fn items(&self) -> &[(String, String)] {
        &self.items
    }
}

/// Semantic checks that serde cannot express (ranges, cross-field rules, files that must
/// exist). Implementations push every problem, they do not stop at the first.
pub trait Validate {
    /// Pushes one entry per problem, naming the key path it is about.
    fn validate(&self, problems: &mut Problems);

    /// Keys that were spelt otherwise before, as `(old key path, new key path)`: an old key
    /// in a file is an unknown key whose message names the new one. Sequence items are
    /// written `[]` (`sources.logs[].file`).
    fn renamed_keys() -> &'static [(&'static str, &'static str)]
    where
        Self: Sized,
    {
        &[]
    }
}
