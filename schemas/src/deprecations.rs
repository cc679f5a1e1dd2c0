//! The Kubernetes API deprecation table (Fairwinds pluto's `versions.yaml`, Apache-2.0, in
//! `schemas/data/deprecations.yaml`): which `apiVersion` of which kind was deprecated and removed in which
//! release, and what replaces it. The agent's `deprecated-apis` probe and the release planner judge by these
//! same rows.

use serde::Deserialize;

/// The table as shipped (YAML).
pub const DEPRECATIONS_YAML: &str = include_str!("../data/deprecations.yaml");

/// One row: `kind` served as `version` (`group/version`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Deprecation {
    /// The `group/version`, e.g. `policy/v1beta1`.
    pub version: String,
    /// The kind, e.g. `PodDisruptionBudget`.
    pub kind: String,
    /// Release that deprecated it (`v1.21.0`), empty when never.
    #[serde(rename = "deprecated-in", default)]
    pub deprecated_in: String,
    /// Release that removed it (`v1.25.0`), empty when not (yet).
    #[serde(rename = "removed-in", default)]
    pub removed_in: String,
    /// What to use instead (`policy/v1`), empty when there is no replacement API.
    #[serde(rename = "replacement-api", default)]
    pub replacement: String,
    /// Release from which the replacement is served.
    #[serde(rename = "replacement-available-in", default)]
    pub replacement_since: String,
    /// Whose API it is (`k8s`, `istio`, `cert-manager`, …).
    #[serde(default)]
    pub component: String,
}

impl Deprecation {
    /// The minor release that deprecated it.
    pub fn deprecated_minor(&self) -> Option<u32> {
        minor_of(&self.deprecated_in)
    }
    /// The minor release that removed it.
    pub fn removed_minor(&self) -> Option<u32> {
        minor_of(&self.removed_in)
    }
}

#[derive(Deserialize)]
struct Table {
    #[serde(rename = "deprecated-versions")]
    rows: Vec<Deprecation>,
}

/// Every row of the table.
pub fn rows() -> &'static [Deprecation] {
    static T: std::sync::OnceLock<Vec<Deprecation>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        serde_yaml::from_str::<Table>(DEPRECATIONS_YAML)
            .map(|t| t.rows)
            .expect("the embedded deprecation table parses (a unit test checks it)")
    })
}

/// The row of `kind` served as `api_version`, if the table has one.
pub fn find(api_version: &str, kind: &str) -> Option<&'static Deprecation> {
    rows()
        .iter()
        .find(|r| r.version == api_version && r.kind == kind)
}

/// The minor number of a release string (`v1.25.0` → 25).
pub fn minor_of(v: &str) -> Option<u32> {
    v.trim_start_matches('v').split('.').nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_table_is_the_fixture_and_parses() {
        let fixture = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/deprecations/pluto-versions.yaml"
        ))
        .expect("fixture");
        assert_eq!(
            DEPRECATIONS_YAML, fixture,
            "schemas/data/deprecations.yaml must stay a copy of the fixture"
        );
        assert!(rows().len() > 100);
        let pdb = find("policy/v1beta1", "PodDisruptionBudget").expect("row");
        assert_eq!(
            (pdb.removed_minor(), pdb.replacement.as_str()),
            (Some(25), "policy/v1")
        );
        assert_eq!(minor_of("v1.16.0"), Some(16));
        assert_eq!(minor_of(""), None);
    }
}
