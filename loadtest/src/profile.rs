//! Kubernetes release profiles: for each simulated minor release (1.24 through 1.35), the API
//! groups, versions and resources the real kube-apiserver serves **by default**, and the
//! discovery documents (`/version`, `/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`) built
//! from them, shaped as that release shaped them.
//!
//! Everything is driven by three tables: `RELEASES` (one line per minor, with its last verified
//! build), `TABLE` (one row per group/version with the minors that serve it) and the resource
//! rows inside it (each with its own serving range). Alpha versions and the beta versions that are
//! off by default (every beta introduced since 1.24) are not served.
//!
//! Deliberately left out: `storageVersionHash` (optional in `APIResource`, depends on each
//! release's storage version, used only by storage migration), and `/apis/<group>` documents.

// Sources (checked 2026; "code" means kubernetes/kubernetes at the named place):
// - Deprecation guide, kubernetes.io/docs/reference/using-api/deprecation-guide (removals in
//   1.25, 1.26, 1.27, 1.29, 1.32).
// - code pkg/controlplane/instance.go `DefaultAPIResourceConfigSource` (1.24-1.31 lists, incl.
//   `legacyBetaEnabledByDefaultResources` and `betaAPIGroupVersionsDisabledByDefault`): which beta
//   versions stay on. admissionregistration.k8s.io/v1beta1, authentication.k8s.io/v1beta1 and
//   storage.k8s.io/v1beta1 (after 1.26) are disabled by default, so ValidatingAdmissionPolicy
//   v1beta1 (1.28-1.29) and SelfSubjectReview v1beta1 (1.27) were never served by default.
// - code cmd/kube-apiserver/app/aggregator.go + pkg/controlplane/apiserver/aggregator.go
//   (APIService group/version priorities: the order of `/apis`), kube-aggregator `apisHandler`
//   (apiregistration.k8s.io listed first).
// - code api/discovery/*.json fixtures and pkg/registry/core/rest/storage_core.go (verbs, short
//   names, categories, subresources; `pods/resize` only with InPlacePodVerticalScaling, beta and
//   on by default from 1.33); kubernetes PR #113542 (singularName for built-in types, 1.27);
//   PR #115843 (NetworkPolicy status removed in 1.28); xrstf/kube-api.ninja release dumps.
// - /version: published `kubectl/kubeadm version` outputs of each build; emulation and
//   min-compatibility fields appear from 1.33 (compatibility versions, KEP-4330).
// Pluto table (shared/fixtures/deprecations/pluto-versions.yaml) vs upstream:
// - flowcontrol v1beta1 FlowSchema/PriorityLevelConfiguration: pluto says removed in 1.29
//   (replacement v1beta3); upstream stopped serving v1beta1 in 1.26 (pluto's own "FlowControl"
//   row agrees with 1.26).
// - flowcontrol v1beta3 FlowSchema: pluto says deprecated in 1.24, but v1beta3 first shipped in
//   1.26 and code marks it "deprecate in 1.29, remove in 1.32" (pluto's PriorityLevelConfiguration
//   row says 1.31). The removals (v1beta2 in 1.29, v1beta3 in 1.32) agree.
// - admissionregistration v1alpha1 ValidatingAdmissionPolicy "removed 1.33": alpha, never served
//   by default; pluto has no row for the v1beta1 version (off by default, see above).
// - resource.k8s.io v1alpha3/v1beta1 and storagemigration rows: not in the deprecation guide; none
//   of them is served by default in 1.24-1.35, so they do not affect the profiles.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// Last minor in a serving range that is still open (served by the newest profile and after).
const OPEN: u32 = u32::MAX;
/// First minor for rows already served before the oldest simulated release.
const EARLIER: u32 = 0;
/// From this minor the apiserver fills `singularName` for built-in resources (PR #113542).
const SINGULAR_NAMES_SINCE: u32 = 27;
/// From this minor `/version` carries the emulation and min-compatibility fields.
const EMULATION_FIELDS_SINCE: u32 = 33;

/// One served resource of one group/version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiResource {
    /// API group, `""` for the core group.
    pub group: &'static str,
    /// API version inside the group, e.g. `"v1"`.
    pub version: &'static str,
    /// Kind, e.g. `"CronJob"`.
    pub kind: &'static str,
    /// Plural resource name (the URL segment), e.g. `"cronjobs"`.
    pub plural: &'static str,
    /// Singular resource name, e.g. `"cronjob"`.
    pub singular: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Short names kubectl accepts, e.g. `["cj"]`.
    pub short_names: &'static [&'static str],
    /// Verbs of the resource itself, as discovery lists them.
    pub verbs: &'static [&'static str],
    /// Subresources, e.g. `["status", "scale"]`.
    pub subresources: &'static [&'static str],
    /// Categories, e.g. `["all"]`.
    pub categories: &'static [&'static str],
}

impl ApiResource {
    /// `"v1"` for the core group, `"<group>/<version>"` otherwise.
    pub fn api_version(&self) -> String {
        group_version(self.group, self.version)
    }
}

/// The served API of one Kubernetes minor release.
#[derive(Debug, Clone)]
pub struct Profile {
    /// The minor release, e.g. `24` for 1.24.
    pub minor: u32,
    /// The `gitVersion` this profile reports, e.g. `"v1.24.17"`.
    pub git_version: String,
    /// Every served resource, in discovery order (group/version order, then by plural).
    pub resources: Vec<ApiResource>,
}

/// Why no profile can be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not a supported release.
    #[error(
        "unsupported Kubernetes version {0:?}: supported are 1.{first} to 1.{last}",
        first = FIRST_MINOR,
        last = LAST_MINOR
    )]
    Unsupported(String),
}

impl Profile {
    /// "1.24", "v1.24", "1.24.3" → the 1.24 profile.
    pub fn parse(version: &str) -> Result<Profile, Error> {
        parse_minor(version)
            .and_then(|minor| Profile::for_minor(minor).ok())
            .ok_or_else(|| Error::Unsupported(version.to_owned()))
    }

    /// The profile of 1.`minor`.
    pub fn for_minor(minor: u32) -> Result<Profile, Error> {
        let release = release(minor).ok_or_else(|| Error::Unsupported(format!("1.{minor}")))?;
        let served: Vec<&GroupVersionRow> = TABLE.iter().filter(|row| row.serves(minor)).collect();
        let order = discovery_order(served.iter().map(|row| (row.group, row.version)));
        let mut resources = Vec::new();
        for (group, version) in order {
            let Some(row) = served
                .iter()
                .find(|row| row.group == group && row.version == version)
            else {
                continue;
            };
            let mut rows: Vec<&Res> = row.resources.iter().filter(|r| r.serves(minor)).collect();
            rows.sort_by_key(|r| r.plural);
            resources.extend(rows.into_iter().map(|r| r.resource(group, version)));
        }
        Ok(Profile {
            minor,
            git_version: release.git_version.to_owned(),
            resources,
        })
    }

    /// The supported minors, oldest first.
    pub fn supported_minors() -> std::ops::RangeInclusive<u32> {
        FIRST_MINOR..=LAST_MINOR
    }

    /// The served (group, version) pairs, in the apiserver's order.
    pub fn group_versions(&self) -> Vec<(&'static str, &'static str)> {
        let mut seen = BTreeSet::new();
        let pairs: Vec<_> = self
            .resources
            .iter()
            .map(|r| (r.group, r.version))
            .filter(|pair| seen.insert(*pair))
            .collect();
        discovery_order(pairs)
    }

    /// Find by group + version + plural (what the URL names). None = not served → the server returns 404.
    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<&ApiResource> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// The preferred version of a group (what `/apis` lists as preferredVersion).
    pub fn preferred_version(&self, group: &str) -> Option<&'static str> {
        self.group_versions()
            .into_iter()
            .find(|(g, _)| *g == group)
            .map(|(_, version)| version)
    }

    /// The /version document (major, minor, gitVersion, gitCommit, gitTreeState "clean", buildDate, goVersion matching that release, compiler "gc", platform "linux/amd64").
    pub fn version_json(&self) -> Value {
        let release = release(self.minor);
        let field = |pick: fn(&Release) -> &'static str| release.map(pick).unwrap_or_default();
        let mut doc = Map::new();
        doc.insert("major".into(), json!("1"));
        doc.insert("minor".into(), json!(self.minor.to_string()));
        if self.minor >= EMULATION_FIELDS_SINCE {
            doc.insert("emulationMajor".into(), json!("1"));
            doc.insert("emulationMinor".into(), json!(self.minor.to_string()));
            doc.insert("minCompatibilityMajor".into(), json!("1"));
            doc.insert(
                "minCompatibilityMinor".into(),
                json!((self.minor - 1).to_string()),
            );
        }
        doc.insert("gitVersion".into(), json!(self.git_version));
        doc.insert("gitCommit".into(), json!(field(|r| r.git_commit)));
        doc.insert("gitTreeState".into(), json!("clean"));
        doc.insert("buildDate".into(), json!(field(|r| r.build_date)));
        doc.insert("goVersion".into(), json!(field(|r| r.go_version)));
        doc.insert("compiler".into(), json!("gc"));
        doc.insert("platform".into(), json!("linux/amd64"));
        Value::Object(doc)
    }

    /// `/api` (APIVersions, versions ["v1"], serverAddressByClientCIDRs with the given address).
    pub fn core_versions_json(&self, server_address: &str) -> Value {
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                { "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }
            ],
        })
    }

    /// `/apis` (APIGroupList with every served group, its versions in the apiserver's priority order, preferredVersion).
    pub fn group_list_json(&self) -> Value {
        let mut groups: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
        for (group, version) in self.group_versions() {
            if group.is_empty() {
                continue;
            }
            match groups.iter_mut().find(|(g, _)| *g == group) {
                Some((_, versions)) => versions.push(version),
                None => groups.push((group, vec![version])),
            }
        }
        let groups: Vec<Value> = groups
            .into_iter()
            .map(|(group, versions)| {
                let entry = |version: &str| {
                    json!({ "groupVersion": group_version(group, version), "version": version })
                };
                json!({
                    "name": group,
                    "versions": versions.iter().map(|v| entry(v)).collect::<Vec<_>>(),
                    "preferredVersion": entry(versions[0]),
                })
            })
            .collect();
        json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
    }

    /// `/api/v1` or `/apis/<group>/<version>` (APIResourceList including subresource entries like "deployments/status", "deployments/scale" with their own kind/verbs as the real apiserver lists them). None when not served.
    pub fn resource_list_json(&self, group: &str, version: &str) -> Option<Value> {
        let resources: Vec<&ApiResource> = self
            .resources
            .iter()
            .filter(|r| r.group == group && r.version == version)
            .collect();
        if resources.is_empty() {
            return None;
        }
        let mut entries: Vec<(String, Value)> = Vec::new();
        for resource in resources {
            entries.push((resource.plural.to_owned(), self.resource_entry(resource)));
            for sub in resource.subresources {
                if let Some(shape) = subresource_shape(resource, sub) {
                    let name = format!("{}/{sub}", resource.plural);
                    entries.push((name.clone(), shape.entry(&name, resource.namespaced)));
                }
            }
        }
        // The apiserver installs paths sorted, so the list is ordered by name.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut doc = Map::new();
        doc.insert("kind".into(), json!("APIResourceList"));
        if !group.is_empty() {
            doc.insert("apiVersion".into(), json!("v1"));
        }
        doc.insert("groupVersion".into(), json!(group_version(group, version)));
        doc.insert(
            "resources".into(),
            Value::Array(entries.into_iter().map(|(_, entry)| entry).collect()),
        );
        Some(Value::Object(doc))
    }

    fn resource_entry(&self, resource: &ApiResource) -> Value {
        let singular = if self.minor >= SINGULAR_NAMES_SINCE {
            resource.singular
        } else {
            ""
        };
        let mut entry = Map::new();
        entry.insert("name".into(), json!(resource.plural));
        entry.insert("singularName".into(), json!(singular));
        entry.insert("namespaced".into(), json!(resource.namespaced));
        entry.insert("kind".into(), json!(resource.kind));
        entry.insert("verbs".into(), json!(resource.verbs));
        if !resource.short_names.is_empty() {
            entry.insert("shortNames".into(), json!(resource.short_names));
        }
        if !resource.categories.is_empty() {
            entry.insert("categories".into(), json!(resource.categories));
        }
        Value::Object(entry)
    }
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    }
}

/// "1.24", "v1.24", "1.24.3", "v1.31.14-gke.1" → 24. Only major 1.
fn parse_minor(text: &str) -> Option<u32> {
    let text = text.trim();
    let text = text.strip_prefix('v').unwrap_or(text);
    let mut parts = text.splitn(3, '.');
    if parts.next()? != "1" {
        return None;
    }
    let minor = parts.next()?;
    let minor = minor.strip_suffix('+').unwrap_or(minor);
    if let Some(patch) = parts.next() {
        let digits = patch.split(['-', '+']).next().unwrap_or_default();
        if !is_number(digits) {
            return None;
        }
    }
    if !is_number(minor) {
        return None;
    }
    minor.parse().ok()
}

fn is_number(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Orders (group, version) pairs as kube-apiserver's discovery does: the core group first, then
/// `/apis` order — apiregistration.k8s.io first, then groups by APIService priority (highest
/// first, ties by APIService name `<version>.<group>`), versions by version priority.
fn discovery_order(
    pairs: impl IntoIterator<Item = (&'static str, &'static str)>,
) -> Vec<(&'static str, &'static str)> {
    let mut services: Vec<(i64, String, &'static str, &'static str, i64)> = pairs
        .into_iter()
        .map(|(group, version)| {
            let (group_priority, version_priority) = priorities(group, version);
            let group_priority = match group {
                "" => i64::MAX,
                "apiregistration.k8s.io" => i64::MAX - 1,
                _ => group_priority,
            };
            let name = format!("{version}.{group}");
            (group_priority, name, group, version, version_priority)
        })
        .collect();
    services.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut groups: Vec<(&'static str, Vec<(i64, &'static str)>)> = Vec::new();
    for (_, _, group, version, version_priority) in services {
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, versions)) => versions.push((version_priority, version)),
            None => groups.push((group, vec![(version_priority, version)])),
        }
    }
    groups
        .into_iter()
        .flat_map(|(group, mut versions)| {
            versions.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
            versions
                .into_iter()
                .map(move |(_, version)| (group, version))
        })
        .collect()
}

fn priorities(group: &str, version: &str) -> (i64, i64) {
    TABLE
        .iter()
        .find(|row| row.group == group && row.version == version)
        .map(|row| (row.group_priority, row.version_priority))
        .unwrap_or_default()
}

/// How the apiserver lists one subresource: its kind, the group/version of that kind when it
/// differs from the parent's, and its verbs.
#[derive(Debug)]
struct SubShape {
    kind: String,
    foreign: Option<(&'static str, &'static str)>,
    verbs: &'static [&'static str],
}

impl SubShape {
    fn entry(&self, name: &str, namespaced: bool) -> Value {
        let mut entry = Map::new();
        entry.insert("name".into(), json!(name));
        entry.insert("singularName".into(), json!(""));
        entry.insert("namespaced".into(), json!(namespaced));
        if let Some((group, version)) = self.foreign {
            entry.insert("group".into(), json!(group));
            entry.insert("version".into(), json!(version));
        }
        entry.insert("kind".into(), json!(self.kind));
        entry.insert("verbs".into(), json!(self.verbs));
        Value::Object(entry)
    }
}

const STATUS_VERBS: &[&str] = &["get", "patch", "update"];
const CONNECT_VERBS: &[&str] = &["create", "get"];
const PROXY_VERBS: &[&str] = &["create", "delete", "get", "patch", "update"];

fn subresource_shape(parent: &ApiResource, sub: &str) -> Option<SubShape> {
    let own = |kind: &str, verbs| {
        Some(SubShape {
            kind: kind.to_owned(),
            foreign: None,
            verbs,
        })
    };
    let foreign = |kind: &str, group, version, verbs| {
        Some(SubShape {
            kind: kind.to_owned(),
            foreign: Some((group, version)),
            verbs,
        })
    };
    match sub {
        "status" | "approval" | "ephemeralcontainers" | "resize" => own(parent.kind, STATUS_VERBS),
        "finalize" => own(parent.kind, &["update"]),
        "log" => own(parent.kind, &["get"]),
        "scale" => foreign("Scale", "autoscaling", "v1", STATUS_VERBS),
        "attach" => own("PodAttachOptions", CONNECT_VERBS),
        "exec" => own("PodExecOptions", CONNECT_VERBS),
        "portforward" => own("PodPortForwardOptions", CONNECT_VERBS),
        "proxy" => own(&format!("{}ProxyOptions", parent.kind), PROXY_VERBS),
        "binding" => own("Binding", CREATE),
        "eviction" => foreign("Eviction", "policy", "v1", CREATE),
        "token" => foreign("TokenRequest", "authentication.k8s.io", "v1", CREATE),
        _ => None,
    }
}

/// One Kubernetes minor release and the build it reports on `/version`.
#[derive(Debug)]
struct Release {
    minor: u32,
    git_version: &'static str,
    git_commit: &'static str,
    build_date: &'static str,
    go_version: &'static str,
}

const fn rel(
    minor: u32,
    git_version: &'static str,
    git_commit: &'static str,
    build_date: &'static str,
    go_version: &'static str,
) -> Release {
    Release {
        minor,
        git_version,
        git_commit,
        build_date,
        go_version,
    }
}

/// The simulated releases, contiguous and oldest first; each with the newest patch whose build
/// metadata (commit, date, Go) could be verified from a published `version` output. 1.24-1.32
/// are the final patches of EOL lines; later patches exist for 1.33 (at least .13), 1.34 (.9)
/// and 1.35 (.8) but their build metadata could not be verified, so they are not claimed here.
#[rustfmt::skip]
const RELEASES: &[Release] = &[
    rel(24, "v1.24.17", "22a9682c8fe855c321be75c5faacde343f909b04", "2023-08-23T23:37:25Z", "go1.20.7"),
    rel(25, "v1.25.16", "c5f43560a4f98f2af3743a59299fb79f07924373", "2023-11-15T22:39:12Z", "go1.20.10"),
    rel(26, "v1.26.15", "1649f592f1909b97aa3c2a0a8f968a3fd05a7b8b", "2024-03-14T00:54:27Z", "go1.21.8"),
    rel(27, "v1.27.16", "cbb86e0d7f4a049666fac0551e8b02ef3d6c3d9a", "2024-07-17T01:52:04Z", "go1.22.5"),
    rel(28, "v1.28.15", "841856557ef0f6a399096c42635d114d6f2cf7f4", "2024-10-22T20:33:16Z", "go1.22.8"),
    rel(29, "v1.29.15", "0d0f172cdf9fd42d6feee3467374b58d3e168df0", "2025-03-11T17:46:36Z", "go1.23.6"),
    rel(30, "v1.30.14", "9e18483918821121abdf9aa82bc14d66df5d68cd", "2025-06-17T18:29:20Z", "go1.23.10"),
    rel(31, "v1.31.14", "5e00b99bac504844579ec74886b6cc5c9611ca19", "2025-11-11T20:24:51Z", "go1.24.9"),
    rel(32, "v1.32.13", "6172d7357c6287643350a4fc7e048f24098f2a1b", "2026-02-26T20:22:27Z", "go1.24.13"),
    rel(33, "v1.33.7", "a7245cdf3f69e11356c7e8f92b3e78ca4ee4e757", "2025-12-09T14:41:01Z", "go1.24.11"),
    rel(34, "v1.34.8", "1f328c5e9dd683d0c5e69f3d7d58f8371278dec2", "2026-05-12T09:52:10Z", "go1.25.9"),
    rel(35, "v1.35.7", "96cb9ab4201d88ce5e549fde047a686171838fdb", "2026-07-22T17:53:59Z", "go1.25.12"),
];

const FIRST_MINOR: u32 = RELEASES[0].minor;
const LAST_MINOR: u32 = RELEASES[RELEASES.len() - 1].minor;

fn release(minor: u32) -> Option<&'static Release> {
    RELEASES.iter().find(|r| r.minor == minor)
}

/// One group/version: the minors that serve it by default (inclusive), its APIService priorities
/// (cmd/kube-apiserver/app/aggregator.go) and its resources.
#[derive(Debug)]
struct GroupVersionRow {
    group: &'static str,
    version: &'static str,
    first: u32,
    last: u32,
    group_priority: i64,
    version_priority: i64,
    resources: &'static [Res],
}

impl GroupVersionRow {
    fn serves(&self, minor: u32) -> bool {
        (self.first..=self.last).contains(&minor) && self.resources.iter().any(|r| r.serves(minor))
    }
}

const fn gv(
    group: &'static str,
    version: &'static str,
    (first, last): (u32, u32),
    (group_priority, version_priority): (i64, i64),
    resources: &'static [Res],
) -> GroupVersionRow {
    GroupVersionRow {
        group,
        version,
        first,
        last,
        group_priority,
        version_priority,
        resources,
    }
}

/// One resource row: what discovery says about it, and the minors serving it (inclusive).
#[derive(Debug, Clone, Copy)]
struct Res {
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    verbs: &'static [&'static str],
    subresources: &'static [&'static str],
    categories: &'static [&'static str],
    first: u32,
    last: u32,
}

impl Res {
    const fn namespaced(kind: &'static str, plural: &'static str, singular: &'static str) -> Res {
        Res {
            kind,
            plural,
            singular,
            namespaced: true,
            short_names: &[],
            verbs: RW,
            subresources: &[],
            categories: &[],
            first: EARLIER,
            last: OPEN,
        }
    }

    const fn cluster(kind: &'static str, plural: &'static str, singular: &'static str) -> Res {
        let mut res = Res::namespaced(kind, plural, singular);
        res.namespaced = false;
        res
    }

    const fn short(mut self, short_names: &'static [&'static str]) -> Res {
        self.short_names = short_names;
        self
    }

    const fn verbs(mut self, verbs: &'static [&'static str]) -> Res {
        self.verbs = verbs;
        self
    }

    const fn subs(mut self, subresources: &'static [&'static str]) -> Res {
        self.subresources = subresources;
        self
    }

    const fn cats(mut self, categories: &'static [&'static str]) -> Res {
        self.categories = categories;
        self
    }

    const fn since(mut self, minor: u32) -> Res {
        self.first = minor;
        self
    }

    const fn until(mut self, minor: u32) -> Res {
        self.last = minor;
        self
    }

    fn serves(&self, minor: u32) -> bool {
        (self.first..=self.last).contains(&minor)
    }

    fn resource(&self, group: &'static str, version: &'static str) -> ApiResource {
        ApiResource {
            group,
            version,
            kind: self.kind,
            plural: self.plural,
            singular: self.singular,
            namespaced: self.namespaced,
            short_names: self.short_names,
            verbs: self.verbs,
            subresources: self.subresources,
            categories: self.categories,
        }
    }
}

const RW: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const RW_NO_COLLECTION: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];
const CREATE: &[&str] = &["create"];
const READ: &[&str] = &["get", "list"];
const ALL: &[&str] = &["all"];
const API_EXTENSIONS: &[&str] = &["api-extensions"];
const STATUS: &[&str] = &["status"];
const SCALE_STATUS: &[&str] = &["scale", "status"];

const POD_SUBS: &[&str] = &[
    "attach",
    "binding",
    "ephemeralcontainers",
    "eviction",
    "exec",
    "log",
    "portforward",
    "proxy",
    "status",
];
const POD_SUBS_WITH_RESIZE: &[&str] = &[
    "attach",
    "binding",
    "ephemeralcontainers",
    "eviction",
    "exec",
    "log",
    "portforward",
    "proxy",
    "resize",
    "status",
];

const CORE_V1: &[Res] = &[
    Res::namespaced("Binding", "bindings", "binding").verbs(CREATE),
    Res::cluster("ComponentStatus", "componentstatuses", "componentstatus")
        .short(&["cs"])
        .verbs(READ),
    Res::namespaced("ConfigMap", "configmaps", "configmap").short(&["cm"]),
    Res::namespaced("Endpoints", "endpoints", "endpoints").short(&["ep"]),
    Res::namespaced("Event", "events", "event").short(&["ev"]),
    Res::namespaced("LimitRange", "limitranges", "limitrange").short(&["limits"]),
    Res::cluster("Namespace", "namespaces", "namespace")
        .short(&["ns"])
        .verbs(RW_NO_COLLECTION)
        .subs(&["finalize", "status"]),
    Res::cluster("Node", "nodes", "node")
        .short(&["no"])
        .subs(&["proxy", "status"]),
    Res::namespaced(
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
    )
    .short(&["pvc"])
    .subs(STATUS),
    Res::cluster("PersistentVolume", "persistentvolumes", "persistentvolume")
        .short(&["pv"])
        .subs(STATUS),
    // pods/resize is registered only with InPlacePodVerticalScaling, on by default from 1.33.
    Res::namespaced("Pod", "pods", "pod")
        .short(&["po"])
        .cats(ALL)
        .subs(POD_SUBS)
        .until(32),
    Res::namespaced("Pod", "pods", "pod")
        .short(&["po"])
        .cats(ALL)
        .subs(POD_SUBS_WITH_RESIZE)
        .since(33),
    Res::namespaced("PodTemplate", "podtemplates", "podtemplate"),
    Res::namespaced(
        "ReplicationController",
        "replicationcontrollers",
        "replicationcontroller",
    )
    .short(&["rc"])
    .cats(ALL)
    .subs(SCALE_STATUS),
    Res::namespaced("ResourceQuota", "resourcequotas", "resourcequota")
        .short(&["quota"])
        .subs(STATUS),
    Res::namespaced("Secret", "secrets", "secret"),
    Res::namespaced("ServiceAccount", "serviceaccounts", "serviceaccount")
        .short(&["sa"])
        .subs(&["token"]),
    Res::namespaced("Service", "services", "service")
        .short(&["svc"])
        .cats(ALL)
        .subs(&["proxy", "status"]),
];

const APIREGISTRATION_V1: &[Res] = &[Res::cluster("APIService", "apiservices", "apiservice")
    .cats(API_EXTENSIONS)
    .subs(STATUS)];

const APPS_V1: &[Res] = &[
    Res::namespaced(
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
    ),
    Res::namespaced("DaemonSet", "daemonsets", "daemonset")
        .short(&["ds"])
        .cats(ALL)
        .subs(STATUS),
    Res::namespaced("Deployment", "deployments", "deployment")
        .short(&["deploy"])
        .cats(ALL)
        .subs(SCALE_STATUS),
    Res::namespaced("ReplicaSet", "replicasets", "replicaset")
        .short(&["rs"])
        .cats(ALL)
        .subs(SCALE_STATUS),
    Res::namespaced("StatefulSet", "statefulsets", "statefulset")
        .short(&["sts"])
        .cats(ALL)
        .subs(SCALE_STATUS),
];

const EVENTS: &[Res] = &[Res::namespaced("Event", "events", "event").short(&["ev"])];

const AUTHENTICATION_V1: &[Res] = &[
    Res::cluster(
        "SelfSubjectReview",
        "selfsubjectreviews",
        "selfsubjectreview",
    )
    .verbs(CREATE)
    .since(28),
    Res::cluster("TokenReview", "tokenreviews", "tokenreview").verbs(CREATE),
];

const AUTHORIZATION_V1: &[Res] = &[
    Res::namespaced(
        "LocalSubjectAccessReview",
        "localsubjectaccessreviews",
        "localsubjectaccessreview",
    )
    .verbs(CREATE),
    Res::cluster(
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
    )
    .verbs(CREATE),
    Res::cluster(
        "SelfSubjectRulesReview",
        "selfsubjectrulesreviews",
        "selfsubjectrulesreview",
    )
    .verbs(CREATE),
    Res::cluster(
        "SubjectAccessReview",
        "subjectaccessreviews",
        "subjectaccessreview",
    )
    .verbs(CREATE),
];

const HPA: &[Res] = &[Res::namespaced(
    "HorizontalPodAutoscaler",
    "horizontalpodautoscalers",
    "horizontalpodautoscaler",
)
.short(&["hpa"])
.cats(ALL)
.subs(STATUS)];

const CRONJOB: Res = Res::namespaced("CronJob", "cronjobs", "cronjob")
    .short(&["cj"])
    .cats(ALL)
    .subs(STATUS);
const BATCH_V1: &[Res] = &[
    CRONJOB,
    Res::namespaced("Job", "jobs", "job").cats(ALL).subs(STATUS),
];
const BATCH_V1BETA1: &[Res] = &[CRONJOB];

const CERTIFICATES_V1: &[Res] = &[Res::cluster(
    "CertificateSigningRequest",
    "certificatesigningrequests",
    "certificatesigningrequest",
)
.short(&["csr"])
.subs(&["approval", "status"])];

const NETWORKING_V1: &[Res] = &[
    Res::cluster("IngressClass", "ingressclasses", "ingressclass"),
    Res::namespaced("Ingress", "ingresses", "ingress")
        .short(&["ing"])
        .subs(STATUS),
    Res::cluster("IPAddress", "ipaddresses", "ipaddress")
        .short(&["ip"])
        .since(33),
    // The alpha NetworkPolicyStatus field came with a status subresource; both went in 1.28.
    Res::namespaced("NetworkPolicy", "networkpolicies", "networkpolicy")
        .short(&["netpol"])
        .subs(STATUS)
        .until(27),
    Res::namespaced("NetworkPolicy", "networkpolicies", "networkpolicy")
        .short(&["netpol"])
        .since(28),
    Res::cluster("ServiceCIDR", "servicecidrs", "servicecidr")
        .subs(STATUS)
        .since(33),
];

const PDB: Res = Res::namespaced(
    "PodDisruptionBudget",
    "poddisruptionbudgets",
    "poddisruptionbudget",
)
.short(&["pdb"])
.subs(STATUS);
const POLICY_V1: &[Res] = &[PDB];
const POLICY_V1BETA1: &[Res] = &[
    PDB,
    Res::cluster(
        "PodSecurityPolicy",
        "podsecuritypolicies",
        "podsecuritypolicy",
    )
    .short(&["psp"]),
];

const RBAC_V1: &[Res] = &[
    Res::cluster(
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
    ),
    Res::cluster("ClusterRole", "clusterroles", "clusterrole"),
    Res::namespaced("RoleBinding", "rolebindings", "rolebinding"),
    Res::namespaced("Role", "roles", "role"),
];

const CSI_STORAGE_CAPACITY: Res = Res::namespaced(
    "CSIStorageCapacity",
    "csistoragecapacities",
    "csistoragecapacity",
);
const STORAGE_V1: &[Res] = &[
    Res::cluster("CSIDriver", "csidrivers", "csidriver"),
    Res::cluster("CSINode", "csinodes", "csinode"),
    CSI_STORAGE_CAPACITY,
    Res::cluster("StorageClass", "storageclasses", "storageclass").short(&["sc"]),
    Res::cluster("VolumeAttachment", "volumeattachments", "volumeattachment").subs(STATUS),
    Res::cluster(
        "VolumeAttributesClass",
        "volumeattributesclasses",
        "volumeattributesclass",
    )
    .short(&["vac"])
    .since(34),
];
const STORAGE_V1BETA1: &[Res] = &[CSI_STORAGE_CAPACITY];

const ADMISSIONREGISTRATION_V1: &[Res] = &[
    Res::cluster(
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
    )
    .cats(API_EXTENSIONS),
    Res::cluster(
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
    )
    .cats(API_EXTENSIONS)
    .subs(STATUS)
    .since(30),
    Res::cluster(
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
    )
    .cats(API_EXTENSIONS)
    .since(30),
    Res::cluster(
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
    )
    .cats(API_EXTENSIONS),
];

const APIEXTENSIONS_V1: &[Res] = &[Res::cluster(
    "CustomResourceDefinition",
    "customresourcedefinitions",
    "customresourcedefinition",
)
.short(&["crd", "crds"])
.cats(API_EXTENSIONS)
.subs(STATUS)];

const SCHEDULING_V1: &[Res] =
    &[Res::cluster("PriorityClass", "priorityclasses", "priorityclass").short(&["pc"])];

const COORDINATION_V1: &[Res] = &[Res::namespaced("Lease", "leases", "lease")];

const NODE: &[Res] = &[Res::cluster(
    "RuntimeClass",
    "runtimeclasses",
    "runtimeclass",
)];

const DISCOVERY: &[Res] = &[Res::namespaced(
    "EndpointSlice",
    "endpointslices",
    "endpointslice",
)];

const RESOURCE_V1: &[Res] = &[
    Res::cluster("DeviceClass", "deviceclasses", "deviceclass"),
    Res::namespaced("ResourceClaim", "resourceclaims", "resourceclaim").subs(STATUS),
    Res::namespaced(
        "ResourceClaimTemplate",
        "resourceclaimtemplates",
        "resourceclaimtemplate",
    ),
    Res::cluster("ResourceSlice", "resourceslices", "resourceslice"),
];

const FLOWCONTROL: &[Res] = &[
    Res::cluster("FlowSchema", "flowschemas", "flowschema").subs(STATUS),
    Res::cluster(
        "PriorityLevelConfiguration",
        "prioritylevelconfigurations",
        "prioritylevelconfiguration",
    )
    .subs(STATUS),
];

/// Every group/version served by default in some simulated release: (group, version, (first,
/// last) minor served, (group, version) APIService priority, resources).
#[rustfmt::skip]
const TABLE: &[GroupVersionRow] = &[
    gv("", "v1", (EARLIER, OPEN), (18000, 1), CORE_V1),
    gv("apiregistration.k8s.io", "v1", (EARLIER, OPEN), (0, 15), APIREGISTRATION_V1),
    gv("apps", "v1", (EARLIER, OPEN), (17800, 15), APPS_V1),
    gv("events.k8s.io", "v1", (EARLIER, OPEN), (17750, 15), EVENTS),
    gv("events.k8s.io", "v1beta1", (EARLIER, 24), (17750, 5), EVENTS),
    gv("authentication.k8s.io", "v1", (EARLIER, OPEN), (17700, 15), AUTHENTICATION_V1),
    gv("authorization.k8s.io", "v1", (EARLIER, OPEN), (17600, 15), AUTHORIZATION_V1),
    gv("autoscaling", "v2", (EARLIER, OPEN), (17500, 30), HPA),
    gv("autoscaling", "v1", (EARLIER, OPEN), (17500, 15), HPA),
    gv("autoscaling", "v2beta1", (EARLIER, 24), (17500, 9), HPA),
    gv("autoscaling", "v2beta2", (EARLIER, 25), (17500, 1), HPA),
    gv("batch", "v1", (EARLIER, OPEN), (17400, 15), BATCH_V1),
    gv("batch", "v1beta1", (EARLIER, 24), (17400, 9), BATCH_V1BETA1),
    gv("certificates.k8s.io", "v1", (EARLIER, OPEN), (17300, 15), CERTIFICATES_V1),
    gv("networking.k8s.io", "v1", (EARLIER, OPEN), (17200, 15), NETWORKING_V1),
    gv("policy", "v1", (EARLIER, OPEN), (17100, 15), POLICY_V1),
    gv("policy", "v1beta1", (EARLIER, 24), (17100, 9), POLICY_V1BETA1),
    gv("rbac.authorization.k8s.io", "v1", (EARLIER, OPEN), (17000, 15), RBAC_V1),
    gv("storage.k8s.io", "v1", (EARLIER, OPEN), (16800, 15), STORAGE_V1),
    gv("storage.k8s.io", "v1beta1", (EARLIER, 26), (16800, 9), STORAGE_V1BETA1),
    gv("admissionregistration.k8s.io", "v1", (EARLIER, OPEN), (16700, 15), ADMISSIONREGISTRATION_V1),
    gv("apiextensions.k8s.io", "v1", (EARLIER, OPEN), (16700, 15), APIEXTENSIONS_V1),
    gv("scheduling.k8s.io", "v1", (EARLIER, OPEN), (16600, 15), SCHEDULING_V1),
    gv("coordination.k8s.io", "v1", (EARLIER, OPEN), (16500, 15), COORDINATION_V1),
    gv("node.k8s.io", "v1", (EARLIER, OPEN), (16300, 15), NODE),
    gv("node.k8s.io", "v1beta1", (EARLIER, 24), (16300, 9), NODE),
    gv("discovery.k8s.io", "v1", (EARLIER, OPEN), (16200, 15), DISCOVERY),
    gv("discovery.k8s.io", "v1beta1", (EARLIER, 24), (16200, 12), DISCOVERY),
    // DRA: v1 (GA) from 1.34; its betas (1.32 v1beta1, 1.33 v1beta2) are off by default. The
    // group priority 16200 is the one 1.33 gave resource.k8s.io (v1's own entry not checked).
    gv("resource.k8s.io", "v1", (34, OPEN), (16200, 21), RESOURCE_V1),
    gv("flowcontrol.apiserver.k8s.io", "v1", (29, OPEN), (16100, 21), FLOWCONTROL),
    gv("flowcontrol.apiserver.k8s.io", "v1beta3", (26, 31), (16100, 18), FLOWCONTROL),
    gv("flowcontrol.apiserver.k8s.io", "v1beta2", (EARLIER, 28), (16100, 15), FLOWCONTROL),
    gv("flowcontrol.apiserver.k8s.io", "v1beta1", (EARLIER, 25), (16100, 12), FLOWCONTROL),
];

#[cfg(test)]
mod tests {
    use super::*;

    const FLOWCONTROL_GROUP: &str = "flowcontrol.apiserver.k8s.io";

    fn profile(minor: u32) -> Profile {
        Profile::for_minor(minor).expect("supported minor")
    }

    fn serves(p: &Profile, group: &str, version: &str) -> bool {
        p.group_versions()
            .iter()
            .any(|(g, v)| *g == group && *v == version)
    }

    fn is_prerelease(version: &str) -> bool {
        version.contains("alpha") || version.contains("beta")
    }

    /// Independent statement of the facts (deprecation guide + release notes), not derived from
    /// the table: (group, version, first minor served, last minor served).
    const EXPECTED: &[(&str, &str, u32, u32)] = &[
        ("", "v1", 24, 35),
        ("admissionregistration.k8s.io", "v1", 24, 35),
        ("apiextensions.k8s.io", "v1", 24, 35),
        ("apiregistration.k8s.io", "v1", 24, 35),
        ("apps", "v1", 24, 35),
        ("authentication.k8s.io", "v1", 24, 35),
        ("authorization.k8s.io", "v1", 24, 35),
        ("autoscaling", "v1", 24, 35),
        ("autoscaling", "v2", 24, 35),
        ("autoscaling", "v2beta1", 24, 24),
        ("autoscaling", "v2beta2", 24, 25),
        ("batch", "v1", 24, 35),
        ("batch", "v1beta1", 24, 24),
        ("certificates.k8s.io", "v1", 24, 35),
        ("coordination.k8s.io", "v1", 24, 35),
        ("discovery.k8s.io", "v1", 24, 35),
        ("discovery.k8s.io", "v1beta1", 24, 24),
        ("events.k8s.io", "v1", 24, 35),
        ("events.k8s.io", "v1beta1", 24, 24),
        (FLOWCONTROL_GROUP, "v1", 29, 35),
        (FLOWCONTROL_GROUP, "v1beta1", 24, 25),
        (FLOWCONTROL_GROUP, "v1beta2", 24, 28),
        (FLOWCONTROL_GROUP, "v1beta3", 26, 31),
        ("networking.k8s.io", "v1", 24, 35),
        ("node.k8s.io", "v1", 24, 35),
        ("node.k8s.io", "v1beta1", 24, 24),
        ("policy", "v1", 24, 35),
        ("policy", "v1beta1", 24, 24),
        ("rbac.authorization.k8s.io", "v1", 24, 35),
        ("resource.k8s.io", "v1", 34, 35),
        ("scheduling.k8s.io", "v1", 24, 35),
        ("storage.k8s.io", "v1", 24, 35),
        ("storage.k8s.io", "v1beta1", 24, 26),
    ];

    #[test]
    fn each_release_serves_exactly_the_expected_group_versions() {
        for minor in Profile::supported_minors() {
            let served: BTreeSet<(&str, &str)> =
                profile(minor).group_versions().into_iter().collect();
            let expected: BTreeSet<(&str, &str)> = EXPECTED
                .iter()
                .filter(|(_, _, first, last)| (*first..=*last).contains(&minor))
                .map(|(g, v, _, _)| (*g, *v))
                .collect();
            assert_eq!(served, expected, "1.{minor}");
        }
    }

    #[test]
    fn supported_releases_are_1_24_through_1_35() {
        assert_eq!(Profile::supported_minors(), 24..=35);
        let minors: Vec<u32> = RELEASES.iter().map(|r| r.minor).collect();
        assert_eq!(minors, (24..=35).collect::<Vec<_>>());
    }

    #[test]
    fn release_1_24_still_serves_the_betas_removed_in_1_25() {
        let p = profile(24);
        for (group, version) in [
            ("batch", "v1beta1"),
            ("policy", "v1beta1"),
            ("discovery.k8s.io", "v1beta1"),
            ("events.k8s.io", "v1beta1"),
            ("autoscaling", "v2beta1"),
            ("autoscaling", "v2beta2"),
            ("node.k8s.io", "v1beta1"),
        ] {
            assert!(serves(&p, group, version), "{group}/{version}");
        }
        assert!(
            p.resource("policy", "v1beta1", "podsecuritypolicies")
                .is_some()
        );
        assert!(p.resource("batch", "v1beta1", "cronjobs").is_some());
    }

    #[test]
    fn release_1_25_keeps_autoscaling_v2beta2_but_drops_v2beta1_and_batch_v1beta1() {
        let p = profile(25);
        assert!(serves(&p, "autoscaling", "v2beta2"));
        assert!(!serves(&p, "autoscaling", "v2beta1"));
        assert!(!serves(&p, "batch", "v1beta1"));
        assert!(!serves(&p, "policy", "v1beta1"));
        assert!(p.resource("batch", "v1beta1", "cronjobs").is_none());
        assert!(p.resource_list_json("batch", "v1beta1").is_none());
    }

    #[test]
    fn release_1_26_drops_autoscaling_v2beta2_and_flowcontrol_v1beta1() {
        let p = profile(26);
        assert!(!serves(&p, "autoscaling", "v2beta2"));
        assert!(!serves(&p, FLOWCONTROL_GROUP, "v1beta1"));
        assert!(serves(&p, FLOWCONTROL_GROUP, "v1beta3"));
        assert!(serves(&p, "storage.k8s.io", "v1beta1"));
        assert!(!serves(&profile(27), "storage.k8s.io", "v1beta1"));
    }

    #[test]
    fn flowcontrol_v1beta2_lasts_until_1_28_and_v1_starts_in_1_29() {
        assert!(serves(&profile(28), FLOWCONTROL_GROUP, "v1beta2"));
        assert!(!serves(&profile(28), FLOWCONTROL_GROUP, "v1"));
        assert!(!serves(&profile(29), FLOWCONTROL_GROUP, "v1beta2"));
        assert!(serves(&profile(29), FLOWCONTROL_GROUP, "v1"));
        assert!(serves(&profile(31), FLOWCONTROL_GROUP, "v1beta3"));
        assert!(!serves(&profile(32), FLOWCONTROL_GROUP, "v1beta3"));
    }

    #[test]
    fn batch_v1_cronjobs_are_served_by_every_release() {
        for minor in Profile::supported_minors() {
            let cronjob = profile(minor)
                .resource("batch", "v1", "cronjobs")
                .cloned()
                .expect("batch/v1 cronjobs");
            assert_eq!(cronjob.kind, "CronJob");
            assert_eq!(cronjob.short_names, ["cj"]);
            assert_eq!(cronjob.categories, ["all"]);
            assert_eq!(cronjob.api_version(), "batch/v1");
        }
    }

    #[test]
    fn no_release_serves_an_alpha_version_or_a_beta_introduced_since_1_24() {
        let allowed_betas: BTreeSet<(&str, &str)> = EXPECTED
            .iter()
            .filter(|(_, v, _, _)| is_prerelease(v))
            .map(|(g, v, _, _)| (*g, *v))
            .collect();
        for minor in Profile::supported_minors() {
            for (group, version) in profile(minor).group_versions() {
                assert!(!version.contains("alpha"), "1.{minor} {group}/{version}");
                if version.contains("beta") {
                    assert!(
                        allowed_betas.contains(&(group, version)),
                        "{group}/{version}"
                    );
                }
            }
            let p = profile(minor);
            assert!(!serves(&p, "admissionregistration.k8s.io", "v1beta1"));
            assert!(!serves(&p, "resource.k8s.io", "v1beta1"));
            assert!(!serves(&p, "authentication.k8s.io", "v1beta1"));
        }
    }

    #[test]
    fn apis_added_within_the_range_appear_in_their_release() {
        let has = |minor, group, version, plural| {
            profile(minor).resource(group, version, plural).is_some()
        };
        let adm = "admissionregistration.k8s.io";
        assert!(!has(29, adm, "v1", "validatingadmissionpolicies"));
        assert!(has(30, adm, "v1", "validatingadmissionpolicies"));
        assert!(has(30, adm, "v1", "validatingadmissionpolicybindings"));
        assert!(!has(
            27,
            "authentication.k8s.io",
            "v1",
            "selfsubjectreviews"
        ));
        assert!(has(28, "authentication.k8s.io", "v1", "selfsubjectreviews"));
        assert!(!has(32, "networking.k8s.io", "v1", "ipaddresses"));
        assert!(has(33, "networking.k8s.io", "v1", "ipaddresses"));
        assert!(has(33, "networking.k8s.io", "v1", "servicecidrs"));
        assert!(!has(33, "resource.k8s.io", "v1", "resourceclaims"));
        assert!(has(34, "resource.k8s.io", "v1", "resourceclaims"));
        assert!(!has(33, "storage.k8s.io", "v1", "volumeattributesclasses"));
        assert!(has(34, "storage.k8s.io", "v1", "volumeattributesclasses"));
        assert!(has(24, "storage.k8s.io", "v1", "csistoragecapacities"));
    }

    #[test]
    fn subresources_change_with_the_release() {
        let pod_subs = |minor| {
            profile(minor)
                .resource("", "v1", "pods")
                .unwrap()
                .subresources
        };
        assert!(!pod_subs(32).contains(&"resize"));
        assert!(pod_subs(33).contains(&"resize"));
        let netpol = |minor| {
            profile(minor)
                .resource("networking.k8s.io", "v1", "networkpolicies")
                .unwrap()
                .subresources
        };
        assert_eq!(netpol(27), ["status"]);
        assert!(netpol(28).is_empty());
    }

    #[test]
    fn every_resource_list_is_an_api_resource_list_for_its_group_version() {
        for minor in Profile::supported_minors() {
            let p = profile(minor);
            for (group, version) in p.group_versions() {
                let doc = p.resource_list_json(group, version).expect("served");
                let gv = group_version(group, version);
                assert_eq!(doc["kind"], "APIResourceList", "{gv}");
                assert_eq!(doc["groupVersion"], gv.as_str());
                if group.is_empty() {
                    assert!(doc.get("apiVersion").is_none());
                } else {
                    assert_eq!(doc["apiVersion"], "v1");
                }
                let entries = doc["resources"].as_array().expect("resources");
                assert!(!entries.is_empty());
                let names: Vec<&str> = entries
                    .iter()
                    .map(|e| e["name"].as_str().unwrap())
                    .collect();
                let mut sorted = names.clone();
                sorted.sort_unstable();
                assert_eq!(names, sorted, "{gv} is listed in path order");
                for entry in entries {
                    // The fields k8s-openapi's APIResource requires.
                    assert!(entry["kind"].is_string() && entry["singularName"].is_string());
                    assert!(entry["namespaced"].is_boolean());
                    assert!(!entry["verbs"].as_array().unwrap().is_empty());
                }
            }
            assert!(p.resource_list_json("apps", "v1beta2").is_none());
            assert!(
                p.resource_list_json("nonexistent.example.com", "v1")
                    .is_none()
            );
        }
    }

    #[test]
    fn every_table_subresource_has_a_known_shape() {
        for row in TABLE {
            for res in row.resources {
                let resource = res.resource(row.group, row.version);
                for sub in res.subresources {
                    assert!(
                        subresource_shape(&resource, sub).is_some(),
                        "{}/{sub}",
                        res.plural
                    );
                }
            }
        }
    }

    fn entry(doc: &Value, name: &str) -> Value {
        doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name}"))
    }

    #[test]
    fn subresource_entries_carry_their_own_kind_and_verbs() {
        let p = profile(30);
        let apps = p.resource_list_json("apps", "v1").unwrap();
        let scale = entry(&apps, "deployments/scale");
        assert_eq!(scale["kind"], "Scale");
        assert_eq!(scale["group"], "autoscaling");
        assert_eq!(scale["version"], "v1");
        assert_eq!(scale["verbs"], json!(["get", "patch", "update"]));
        assert_eq!(scale["singularName"], "");
        let status = entry(&apps, "deployments/status");
        assert_eq!(status["kind"], "Deployment");
        assert!(status.get("group").is_none());
        assert_eq!(status["namespaced"], true);

        let core = p.resource_list_json("", "v1").unwrap();
        let eviction = entry(&core, "pods/eviction");
        assert_eq!(
            (&eviction["kind"], &eviction["group"]),
            (&json!("Eviction"), &json!("policy"))
        );
        assert_eq!(entry(&core, "pods/exec")["verbs"], json!(["create", "get"]));
        assert_eq!(entry(&core, "pods/log")["verbs"], json!(["get"]));
        assert_eq!(entry(&core, "nodes/proxy")["kind"], "NodeProxyOptions");
        assert_eq!(
            entry(&core, "namespaces/finalize")["verbs"],
            json!(["update"])
        );
        assert_eq!(
            entry(&core, "serviceaccounts/token")["kind"],
            "TokenRequest"
        );
        assert_eq!(
            entry(&core, "serviceaccounts/token")["group"],
            "authentication.k8s.io"
        );
    }

    #[test]
    fn verbs_and_short_names_match_the_real_apiserver() {
        let p = profile(35);
        let core = p.resource_list_json("", "v1").unwrap();
        let pods = entry(&core, "pods");
        assert_eq!(pods["verbs"], json!(RW));
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["categories"], json!(["all"]));
        assert_eq!(entry(&core, "events")["verbs"], json!(RW));
        let namespaces = entry(&core, "namespaces");
        assert!(
            !namespaces["verbs"]
                .as_array()
                .unwrap()
                .contains(&json!("deletecollection"))
        );
        assert!(namespaces.get("categories").is_none());
        let auth = p.resource_list_json("authentication.k8s.io", "v1").unwrap();
        assert_eq!(entry(&auth, "tokenreviews")["verbs"], json!(["create"]));
        let crds = p.resource_list_json("apiextensions.k8s.io", "v1").unwrap();
        let crd = entry(&crds, "customresourcedefinitions");
        assert_eq!(crd["shortNames"], json!(["crd", "crds"]));
        assert_eq!(crd["categories"], json!(["api-extensions"]));
        for (group, version, plural, short) in [
            ("", "v1", "services", "svc"),
            ("", "v1", "nodes", "no"),
            ("", "v1", "configmaps", "cm"),
            ("", "v1", "endpoints", "ep"),
            ("", "v1", "persistentvolumes", "pv"),
            ("", "v1", "persistentvolumeclaims", "pvc"),
            ("", "v1", "serviceaccounts", "sa"),
            ("apps", "v1", "deployments", "deploy"),
            ("apps", "v1", "daemonsets", "ds"),
            ("apps", "v1", "statefulsets", "sts"),
            ("apps", "v1", "replicasets", "rs"),
            ("networking.k8s.io", "v1", "ingresses", "ing"),
            ("networking.k8s.io", "v1", "networkpolicies", "netpol"),
            ("policy", "v1", "poddisruptionbudgets", "pdb"),
            ("autoscaling", "v2", "horizontalpodautoscalers", "hpa"),
            ("events.k8s.io", "v1", "events", "ev"),
            ("scheduling.k8s.io", "v1", "priorityclasses", "pc"),
            ("storage.k8s.io", "v1", "storageclasses", "sc"),
            (
                "certificates.k8s.io",
                "v1",
                "certificatesigningrequests",
                "csr",
            ),
        ] {
            let r = p.resource(group, version, plural).expect(plural);
            assert_eq!(r.short_names, [short], "{plural}");
        }
    }

    #[test]
    fn singular_names_are_listed_from_1_27() {
        let singular = |minor| {
            let doc = profile(minor).resource_list_json("apps", "v1").unwrap();
            entry(&doc, "deployments")["singularName"].clone()
        };
        assert_eq!(singular(26), "");
        assert_eq!(singular(27), "deployment");
    }

    #[test]
    fn preferred_version_is_ga_wherever_a_ga_version_is_served() {
        for minor in Profile::supported_minors() {
            let p = profile(minor);
            let list = p.group_list_json();
            assert_eq!(list["kind"], "APIGroupList");
            for group in list["groups"].as_array().unwrap() {
                let name = group["name"].as_str().unwrap();
                let versions: Vec<&str> = group["versions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v["version"].as_str().unwrap())
                    .collect();
                let preferred = group["preferredVersion"]["version"].as_str().unwrap();
                assert_eq!(preferred, versions[0], "1.{minor} {name}");
                assert_eq!(p.preferred_version(name), Some(preferred));
                if versions.iter().any(|v| !is_prerelease(v)) {
                    assert!(
                        !is_prerelease(preferred),
                        "1.{minor} {name} prefers {preferred}"
                    );
                }
            }
        }
        assert_eq!(profile(24).preferred_version("autoscaling"), Some("v2"));
        assert_eq!(
            profile(24).preferred_version(FLOWCONTROL_GROUP),
            Some("v1beta2")
        );
        assert_eq!(
            profile(26).preferred_version(FLOWCONTROL_GROUP),
            Some("v1beta3")
        );
        assert_eq!(profile(29).preferred_version(FLOWCONTROL_GROUP), Some("v1"));
        assert_eq!(profile(29).preferred_version(""), Some("v1"));
        assert_eq!(profile(29).preferred_version("resource.k8s.io"), None);
    }

    #[test]
    fn group_list_follows_the_aggregator_order() {
        let groups = |minor| -> Vec<String> {
            profile(minor).group_list_json()["groups"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g["name"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            groups(35),
            [
                "apiregistration.k8s.io",
                "apps",
                "events.k8s.io",
                "authentication.k8s.io",
                "authorization.k8s.io",
                "autoscaling",
                "batch",
                "certificates.k8s.io",
                "networking.k8s.io",
                "policy",
                "rbac.authorization.k8s.io",
                "storage.k8s.io",
                "admissionregistration.k8s.io",
                "apiextensions.k8s.io",
                "scheduling.k8s.io",
                "coordination.k8s.io",
                "node.k8s.io",
                "discovery.k8s.io",
                "resource.k8s.io",
                FLOWCONTROL_GROUP,
            ]
        );
        let autoscaling: Vec<&str> = profile(24)
            .group_versions()
            .into_iter()
            .filter(|(g, _)| *g == "autoscaling")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(autoscaling, ["v2", "v1", "v2beta1", "v2beta2"]);
        assert_eq!(profile(24).group_versions()[0], ("", "v1"));
    }

    #[test]
    fn core_versions_name_the_given_server_address() {
        let doc = profile(30).core_versions_json("10.0.0.1:6443");
        assert_eq!(doc["kind"], "APIVersions");
        assert_eq!(doc["versions"], json!(["v1"]));
        assert_eq!(
            doc["serverAddressByClientCIDRs"][0],
            json!({ "clientCIDR": "0.0.0.0/0", "serverAddress": "10.0.0.1:6443" })
        );
    }

    #[test]
    fn version_document_reports_the_release_build() {
        for minor in Profile::supported_minors() {
            let p = profile(minor);
            let doc = p.version_json();
            assert_eq!(doc["major"], "1");
            assert_eq!(doc["minor"], minor.to_string());
            assert_eq!(doc["gitVersion"], p.git_version.as_str());
            assert!(p.git_version.starts_with(&format!("v1.{minor}.")));
            assert_eq!(doc["gitCommit"].as_str().unwrap().len(), 40);
            assert!(doc["goVersion"].as_str().unwrap().starts_with("go1."));
            assert_eq!(doc["gitTreeState"], "clean");
            assert_eq!(doc["compiler"], "gc");
            assert_eq!(doc["platform"], "linux/amd64");
            assert_eq!(
                doc.get("emulationMinor").is_some(),
                minor >= 33,
                "1.{minor}"
            );
        }
        assert_eq!(profile(24).version_json()["gitVersion"], "v1.24.17");
        assert_eq!(profile(24).version_json()["goVersion"], "go1.20.7");
        assert_eq!(profile(35).version_json()["minCompatibilityMinor"], "34");
    }

    #[test]
    fn parse_accepts_release_spellings_and_rejects_unsupported_ones() {
        for text in ["1.24", "v1.24", "1.24.3", " v1.24.17 "] {
            assert_eq!(Profile::parse(text).unwrap().minor, 24, "{text}");
        }
        assert_eq!(Profile::parse("v1.31.2").unwrap().minor, 31);
        assert_eq!(Profile::parse("v1.31.14-gke.1020000").unwrap().minor, 31);
        let err = Profile::parse("1.20").unwrap_err();
        assert!(matches!(&err, Error::Unsupported(v) if v == "1.20"));
        assert_eq!(
            err.to_string(),
            "unsupported Kubernetes version \"1.20\": supported are 1.24 to 1.35"
        );
        for text in ["1.36", "2.24", "1", "v1.x", "1.24.x", "", "1.24.3.4"] {
            assert!(Profile::parse(text).is_err(), "{text:?}");
        }
        assert!(matches!(Profile::for_minor(23), Err(Error::Unsupported(v)) if v == "1.23"));
    }
}
