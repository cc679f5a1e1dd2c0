//! Every manifest in `shared/fixtures/manifests/old-apis/` judged against every simulated Kubernetes profile
//! (1.24–1.35, `multipilot-sim`'s discovery tables): an object is blocked exactly when the profile doesn't
//! serve its apiVersion/kind, and a blocked object names the replacement the deprecation table gives.

use std::path::Path;

use multipilot_release::judge::judge;
use multipilot_sim::profile::Profile;

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/manifests/old-apis")
}

fn table_replacement(api_version: &str, kind: &str) -> Option<String> {
    let t: serde_yaml::Value =
        serde_yaml::from_str(multipilot_release::judge::DEPRECATIONS_YAML).expect("table");
    t["deprecated-versions"]
        .as_sequence()?
        .iter()
        .find(|r| r["version"].as_str() == Some(api_version) && r["kind"].as_str() == Some(kind))
        .and_then(|r| r["replacement-api"].as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

#[test]
fn every_old_api_fixture_is_judged_like_each_profile_serves_it() {
    let mut files: Vec<_> = std::fs::read_dir(fixtures())
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !n.starts_with("expected-") && (n.ends_with(".yaml") || n.ends_with(".json"))
        })
        .collect();
    files.sort();
    assert!(files.len() >= 45, "{} fixture files", files.len());
    let (mut judged, mut blocked_count, mut failures) = (0, 0, Vec::new());
    for minor in Profile::supported_minors() {
        let profile = Profile::for_minor(minor).expect("profile");
        let served: Vec<String> = profile
            .group_versions()
            .into_iter()
            .map(|(g, v)| {
                if g.is_empty() {
                    v.to_string()
                } else {
                    format!("{g}/{v}")
                }
            })
            .collect();
        for f in &files {
            let text = std::fs::read_to_string(f).expect("read");
            // review objects (SubjectAccessReview, TokenReview) have no name, so not `render::split`
            let objs: Vec<serde_json::Value> = {
                use serde::Deserialize;
                serde_yaml::Deserializer::from_str(&text)
                    .map(|d| serde_json::Value::deserialize(d).expect("yaml"))
                    .filter(|v| !v.is_null())
                    .collect()
            };
            for o in objs {
                let api = o["apiVersion"].as_str().unwrap_or_default();
                let kind = o["kind"].as_str().unwrap_or_default();
                let (group, version) = api.split_once('/').unwrap_or(("", api));
                let kind_served = profile
                    .resources
                    .iter()
                    .any(|r| r.group == group && r.version == version && r.kind == kind);
                let v = judge(api, kind, &served, minor);
                judged += 1;
                let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("?");
                if v.blocked.is_some() == kind_served {
                    failures.push(format!(
                        "1.{minor} {name}: {kind} {api}: profile serves it: {kind_served}, judged blocked: {:?}",
                        v.blocked
                    ));
                    continue;
                }
                if let Some(why) = &v.blocked {
                    blocked_count += 1;
                    if let Some(rep) = table_replacement(api, kind)
                        && !why.contains(&rep)
                    {
                        failures.push(format!("1.{minor} {name}: {why:?} doesn't name {rep}"));
                    }
                    if kind == "PodSecurityPolicy" && !why.contains("Pod Security admission") {
                        failures.push(format!("1.{minor} {name}: {why:?}"));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        judged > 500 && blocked_count > 400,
        "{judged} judged, {blocked_count} blocked"
    );
}

#[test]
fn cronjob_and_psp_follow_the_removals() {
    for minor in Profile::supported_minors() {
        let profile = Profile::for_minor(minor).expect("profile");
        let served: Vec<String> = profile
            .group_versions()
            .into_iter()
            .map(|(g, v)| {
                if g.is_empty() {
                    v.to_string()
                } else {
                    format!("{g}/{v}")
                }
            })
            .collect();
        let cj = judge("batch/v1beta1", "CronJob", &served, minor);
        let psp = judge("policy/v1beta1", "PodSecurityPolicy", &served, minor);
        assert_eq!(cj.blocked.is_some(), minor >= 25, "1.{minor}: {cj:?}");
        assert_eq!(psp.blocked.is_some(), minor >= 25, "1.{minor}: {psp:?}");
        if minor == 24 {
            assert!(cj.warning.is_some() && psp.warning.is_some());
        }
    }
}
