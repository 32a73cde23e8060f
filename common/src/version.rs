//! The daemons' `--version` text: package version, the git commit it was built from and the
//! cargo features it was built with, for example `0.1.0 (git 2044e9b, features: verbs)`.
//!
//! The commit comes from this crate's build script (`git rev-parse --short HEAD`, `unknown`
//! outside a git checkout). The features are the binary crate's own, so each `main` passes
//! them: `cfg!(feature = ...)` is evaluated in the crate that names it.
//!
//! ```
//! let v = uctel_common::version::describe("0.1.0", "2044e9b", &[("verbs", true)]);
//! assert_eq!(v, "0.1.0 (git 2044e9b, features: verbs)");
//! ```

/// Short git commit of the build (`git rev-parse --short HEAD`), or `unknown` when it was not
/// built from a git checkout.
pub const GIT_COMMIT: &str = env!("UCTEL_GIT_COMMIT");

/// `VERSION (git COMMIT, features: A, B)`; `features: none` when none of `features` is on.
/// `features` lists each optional feature of the binary with whether it is enabled.
pub fn describe(version: &str, commit: &str, features: &[(&str, bool)]) -> String {
    let on: Vec<&str> = features
        .iter()
        .filter(|(_, enabled)| *enabled)
        .map(|(name, _)| *name)
        .collect();
    let features = if on.is_empty() {
        "none".to_owned()
    } else {
        on.join(", ")
    };
    format!("{version} (git {commit}, features: {features})")
}

/// [`describe`] with this build's [`GIT_COMMIT`], as the `&'static str` that clap's
/// `#[command(version = ...)]` takes:
/// `version = uctel_common::version::long(env!("CARGO_PKG_VERSION"), &[("verbs", cfg!(feature = "verbs"))])`.
///
/// The string is leaked: clap builds its command once per process.
pub fn long(version: &str, features: &[(&str, bool)]) -> &'static str {
    Box::leak(describe(version, GIT_COMMIT, features).into_boxed_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_enabled_features_or_none() {
        assert_eq!(
            describe("0.1.0", "2044e9b", &[("verbs", true)]),
            "0.1.0 (git 2044e9b, features: verbs)"
        );
        assert_eq!(
            describe("0.1.0", "unknown", &[("verbs", false)]),
            "0.1.0 (git unknown, features: none)"
        );
        assert_eq!(
            describe("1.2.3", "abc", &[("a", true), ("b", false), ("c", true)]),
            "1.2.3 (git abc, features: a, c)"
        );
    }
}
