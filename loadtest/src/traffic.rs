//! The requests the simulated workloads serve: every Deployment's ready replicas serve
//! [`REQUESTS_PER_REPLICA`] requests a second, and the share that fails follows the image of the pods
//! serving them ([`crate::world::image_error_share`]). During a rollout the updated replicas serve the new
//! template's share and the others the share of what they ran before, so a release's error ratio moves as
//! its rollout proceeds — while the rollout itself stays healthy.
//!
//! The counters are kept per Deployment (by uid) in the cluster's state and only ever grow: a new image,
//! a scale or a rollout changes their rate, never their value; a Deployment deleted and created again starts
//! from zero. They are integrated piecewise: whenever the controllers or a scrape look at a Deployment, the
//! time since the last look is counted at the rate that held then, and the rate is taken anew.
//!
//! The same state is the deployment controller's memory of the template it last rolled out, which is how a
//! change of `spec.replicas` alone (a scale) is told from a new template (a rollout).

use std::collections::HashMap;
use std::time::Instant;

use serde_json::Value;

use crate::store::{Pointer, str_at};
use crate::world::{template_error_share, unpullable};

/// Requests a second one ready replica serves.
pub const REQUESTS_PER_REPLICA: f64 = 10.0;

/// Upper bounds of `http_request_duration_seconds` (the Prometheus client libraries' default buckets) and
/// the share of requests answered within each: a fixed distribution with a mean of
/// [`MEAN_DURATION_S`].
pub const DURATION_BUCKETS: [(f64, f64); 11] = [
    (0.005, 0.02),
    (0.01, 0.08),
    (0.025, 0.35),
    (0.05, 0.72),
    (0.1, 0.92),
    (0.25, 0.985),
    (0.5, 0.996),
    (1.0, 0.999),
    (2.5, 1.0),
    (5.0, 1.0),
    (10.0, 1.0),
];

/// The mean request duration (seconds) the histogram's `_sum` grows by per request.
pub const MEAN_DURATION_S: f64 = 0.045;

/// Ready replicas serving the Deployment's current template, and those still running an older one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Serving {
    /// Ready replicas of the current template.
    pub updated: f64,
    /// Ready replicas of older templates.
    pub old: f64,
}

impl Serving {
    /// As a Deployment's status tells: of the ready replicas, the updated share (`updatedReplicas` of
    /// `replicas`) serves the current template — none while the new pods never pull.
    pub fn of(d: &Value) -> Self {
        let num = |p: &str| d.at(p).and_then(Value::as_i64).unwrap_or(0).max(0) as f64;
        let ready = num("/status/readyReplicas");
        let replicas = num("/status/replicas");
        let updated = num("/status/updatedReplicas");
        let share = if replicas > 0.0 && !unpullable(d) {
            (updated / replicas).min(1.0)
        } else {
            0.0
        };
        Serving {
            updated: ready * share,
            old: ready * (1.0 - share),
        }
    }

    /// All ready replicas.
    pub fn ready(&self) -> f64 {
        self.updated + self.old
    }
}

/// What the deployment controller does with a Deployment whose generation it has not observed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rollout {
    /// A new pod template: replace the pods, one replica per step.
    Template,
    /// The same template, another replica count: scale the current pods.
    Scale,
}

/// One Deployment's traffic and the template its controller last observed.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The pod template at the last observed generation (None until the controller observed one).
    template: Option<Value>,
    /// The generation the template was last looked at for.
    generation: i64,
    /// The error share of the current template's pods.
    updated_share: f64,
    /// The error share of the older pods still serving.
    old_share: f64,
    serving: Serving,
    at: Instant,
    ok: f64,
    errors: f64,
    pass: u64,
    /// The resourceVersion of the Deployment last looked at.
    version: Box<str>,
    /// Whether its controller had nothing left to do at that version.
    settled: bool,
}

impl Workload {
    fn new(d: &Value, now: Instant, pass: u64) -> Self {
        let template = &d["spec"]["template"];
        let share = template_error_share(template);
        Workload {
            template: observed(d).then(|| template.clone()),
            generation: generation(d),
            updated_share: share,
            old_share: share,
            serving: Serving::of(d),
            at: now,
            ok: 0.0,
            errors: 0.0,
            pass,
            version: version(d).into(),
            settled: false,
        }
    }

    /// See [`Workloads::observe`].
    fn look(&mut self, d: &Value, now: Instant, pass: u64) {
        self.pass = pass;
        self.accumulate(now);
        let version = version(d);
        if *self.version != *version {
            self.version = version.into();
            self.settled = false;
        }
        let generation = generation(d);
        if observed(d) && self.generation != generation {
            let template = &d["spec"]["template"];
            if self.template.as_ref() != Some(template) {
                self.old_share = self.error_ratio();
                self.updated_share = template_error_share(template);
                self.template = Some(template.clone());
            }
            self.generation = generation;
        }
        self.serving = Serving::of(d);
        let num = |p: &str| d.at(p).and_then(Value::as_i64).unwrap_or(0);
        if observed(d) && num("/status/updatedReplicas") >= num("/status/replicas") {
            self.old_share = self.updated_share;
        }
    }

    /// Counts the requests served since the last look at the rate that held since.
    fn accumulate(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        if now > self.at {
            self.at = now;
        }
        let total = REQUESTS_PER_REPLICA * self.serving.ready() * dt;
        let errors = REQUESTS_PER_REPLICA
            * (self.serving.updated * self.updated_share + self.serving.old * self.old_share)
            * dt;
        self.errors += errors;
        self.ok += total - errors;
    }

    /// The share of requests failing now (that of the current template when nothing serves).
    pub fn error_ratio(&self) -> f64 {
        let ready = self.serving.ready();
        if ready > 0.0 {
            (self.serving.updated * self.updated_share + self.serving.old * self.old_share) / ready
        } else {
            self.updated_share
        }
    }

    /// Requests answered 200 so far.
    pub fn ok(&self) -> f64 {
        self.ok
    }

    /// Requests answered 500 so far.
    pub fn errors(&self) -> f64 {
        self.errors
    }

    /// Who serves now.
    pub fn serving(&self) -> Serving {
        self.serving
    }
}

fn generation(d: &Value) -> i64 {
    d.at("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

/// The Deployment's resourceVersion ("" when it has none).
fn version(d: &Value) -> &str {
    str_at(d, &["metadata", "resourceVersion"])
}

/// Whether the controller has observed the Deployment's current generation.
fn observed(d: &Value) -> bool {
    d.at("/status/observedGeneration")
        .and_then(Value::as_i64)
        .is_some_and(|o| o >= generation(d))
}

/// Every Deployment's [`Workload`] in one cluster, by uid.
#[derive(Debug, Default)]
pub struct Workloads {
    by_uid: HashMap<String, Workload>,
    pass: u64,
}

impl Workloads {
    /// What the controller does with `d`, whose generation it has not observed: a template it never
    /// rolled out (or a Deployment it never saw) is a rollout; the template it knows is a scale.
    pub fn rollout(&self, d: &Value) -> Rollout {
        let known = self
            .by_uid
            .get(str_at(d, &["metadata", "uid"]))
            .and_then(|w| w.template.as_ref());
        if known == Some(&d["spec"]["template"]) {
            Rollout::Scale
        } else {
            Rollout::Template
        }
    }

    /// Looks at a Deployment at `now`: counts what it served since the last look, then takes its rate
    /// from what it is now. A template the controller has just observed becomes the updated replicas'
    /// error share, and what served until then the older replicas'; once every replica is updated the
    /// older share is gone.
    pub fn observe(&mut self, d: &Value, now: Instant) -> &Workload {
        let uid = str_at(d, &["metadata", "uid"]);
        let pass = self.pass;
        // looked up by &str: the controllers look at every Deployment every step, without allocating
        match self.by_uid.get_mut(uid) {
            Some(w) => w.look(d, now, pass),
            None => {
                self.by_uid
                    .insert(uid.to_string(), Workload::new(d, now, pass));
            }
        }
        &self.by_uid[uid]
    }

    /// Looks at a Deployment again when it is the version last looked at and its controller had nothing
    /// left to do at it (see [`Workloads::settled`]): only what it served since is counted, as
    /// [`observe`](Self::observe) would, without reading it again. `false` (and nothing done) otherwise.
    /// Most Deployments are settled most of the time, and reading each one's fields every step was a
    /// tenth of the simulator's CPU at 50 clusters.
    pub fn look_again(&mut self, d: &Value, now: Instant) -> bool {
        let pass = self.pass;
        match self.by_uid.get_mut(str_at(d, &["metadata", "uid"])) {
            Some(w) if w.settled && *w.version == *version(d) => {
                w.pass = pass;
                w.accumulate(now);
                true
            }
            _ => false,
        }
    }

    /// Notes that the controller has nothing left to do for a Deployment at the version last looked at.
    pub fn settled(&mut self, d: &Value) {
        if let Some(w) = self.by_uid.get_mut(str_at(d, &["metadata", "uid"]))
            && *w.version == *version(d)
        {
            w.settled = true;
        }
    }

    /// A Deployment's workload, if it was ever looked at.
    pub fn get(&self, uid: &str) -> Option<&Workload> {
        self.by_uid.get(uid)
    }

    /// Forgets the Deployments not looked at since the last sweep (deleted ones): called after each pass
    /// of the controller, which looks at every Deployment.
    pub fn sweep(&mut self) {
        let pass = self.pass;
        self.by_uid.retain(|_, w| w.pass == pass);
        self.pass += 1;
    }

    /// How many Deployments are tracked.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    fn deploy(uid: &str, image: &str, generation: i64, status: [i64; 4]) -> Value {
        let [observed, replicas, updated, ready] = status;
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": uid, "generation": generation},
            "spec": {"replicas": replicas, "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image}]}}},
            "status": {"observedGeneration": observed, "replicas": replicas, "updatedReplicas": updated,
                "readyReplicas": ready, "availableReplicas": ready}
        })
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn the_error_tag_sets_the_share_and_other_images_fail_the_base_share() {
        use crate::world::{BASE_ERROR_SHARE, image_error_share};
        assert_eq!(
            image_error_share("registry.example/web:2.0.0-errors30"),
            0.30
        );
        assert_eq!(
            image_error_share("registry.example/web:2.0-errors5-rc1"),
            0.05
        );
        assert_eq!(image_error_share("localhost:5000/web:1-errors100"), 1.0);
        assert_eq!(image_error_share("web:1-errors250"), 1.0);
        assert_eq!(image_error_share("web:1-errors0"), 0.0);
        assert_eq!(
            image_error_share("registry.example/web:2.0.0"),
            BASE_ERROR_SHARE
        );
        // not in the tag: a registry port, a repository name, a digest
        assert_eq!(image_error_share("web-errors30:1"), BASE_ERROR_SHARE);
        assert_eq!(
            image_error_share("registry.example/web@sha256:abc-errors30"),
            BASE_ERROR_SHARE
        );
        assert_eq!(image_error_share("web:1-errors"), BASE_ERROR_SHARE);
        // the worst container of a pod counts
        let t = json!({"spec": {"containers": [{"image": "a:1"}, {"image": "b:1-errors20"}]}});
        assert_eq!(template_error_share(&t), 0.20);
    }

    #[test]
    fn requests_grow_with_ready_replicas_and_the_image_share() {
        let t0 = Instant::now();
        let mut w = Workloads::default();
        let d = deploy("u1", "web:1-errors10", 1, [1, 3, 3, 3]);
        w.observe(&d, t0);
        let at = w.observe(&d, t0 + Duration::from_secs(10));
        // 3 replicas × 10 req/s × 10 s, 10 % failing
        assert!(close(at.ok() + at.errors(), 300.0), "{at:?}");
        assert!(close(at.errors(), 30.0), "{at:?}");
        assert!(close(at.error_ratio(), 0.1));
    }

    #[test]
    fn a_settled_deployment_looked_at_again_counts_as_a_full_look_does() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let at = |rv: &str, status: [i64; 4]| {
            let mut d = deploy("u1", "web:1-errors10", 1, status);
            d["metadata"]["resourceVersion"] = json!(rv);
            d
        };
        let (mut full, mut quick) = (Workloads::default(), Workloads::default());
        let steps = [
            (at("7", [1, 3, 3, 3]), true),
            (at("7", [1, 3, 3, 3]), true),
            // a new version is read in full, and is not settled until told so
            (at("9", [1, 3, 2, 2]), false),
            (at("9", [1, 3, 2, 2]), false),
            (at("12", [1, 3, 3, 3]), true),
            (at("12", [1, 3, 3, 3]), true),
        ];
        let mut quick_looks = 0;
        for (i, (d, settled)) in steps.iter().enumerate() {
            let now = s(10 * i as u64);
            full.observe(d, now);
            if quick.look_again(d, now) {
                quick_looks += 1;
            } else {
                quick.observe(d, now);
                if *settled {
                    quick.settled(d);
                }
            }
            let (a, b) = (full.get("u1").unwrap(), quick.get("u1").unwrap());
            assert!(
                close(a.ok(), b.ok()) && close(a.errors(), b.errors()),
                "step {i}: {a:?} {b:?}"
            );
            full.sweep();
            quick.sweep();
        }
        // the second look at versions 7 and 12; version 9 was never settled
        assert_eq!(quick_looks, 2);
        assert!(
            quick.get("u1").is_some(),
            "a quick look keeps the workload from the sweep"
        );
        assert!(!quick.look_again(&deploy("u2", "web:1", 1, [1, 1, 1, 1]), s(99)));
    }

    #[test]
    fn a_rollout_weighs_updated_replicas_against_the_rest_and_counters_never_go_back() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut w = Workloads::default();
        // running 1.0 (base share), 4 replicas
        w.observe(&deploy("u1", "web:1.0", 1, [1, 4, 4, 4]), s(0));
        // a new template with 40 % errors: not observed by the controller yet, nothing changes
        let pending = deploy("u1", "web:2.0-errors40", 2, [1, 4, 4, 4]);
        assert_eq!(w.rollout(&pending), Rollout::Template);
        let at = w.observe(&pending, s(1));
        assert!(close(at.error_ratio(), 0.001), "{at:?}");
        // observed: no replica updated yet, all serve 1.0
        let at = w.observe(&deploy("u1", "web:2.0-errors40", 2, [2, 4, 0, 4]), s(2));
        assert!(close(at.error_ratio(), 0.001), "{at:?}");
        // one of four updated: a quarter serves 40 %
        let at = w.observe(&deploy("u1", "web:2.0-errors40", 2, [2, 4, 1, 4]), s(3));
        assert!(close(at.error_ratio(), 0.25 * 0.4 + 0.75 * 0.001), "{at:?}");
        let (ok1, err1) = (at.ok(), at.errors());
        // half
        let at = w.observe(&deploy("u1", "web:2.0-errors40", 2, [2, 4, 2, 4]), s(4));
        assert!(close(at.error_ratio(), 0.5 * 0.4 + 0.5 * 0.001), "{at:?}");
        // the second between s(3) and s(4) was served at the quarter's ratio
        assert!(close(
            at.errors() - err1,
            40.0 * (0.25 * 0.4 + 0.75 * 0.001)
        ));
        assert!(at.ok() >= ok1 && at.errors() >= err1);
        // done: all at 40 %
        let at = w.observe(&deploy("u1", "web:2.0-errors40", 2, [2, 4, 4, 4]), s(5));
        assert!(close(at.error_ratio(), 0.4), "{at:?}");
        let (ok2, err2) = (at.ok(), at.errors());
        // rolled back to 1.0: the old share is what served until now (40 %), the new one 0.1 %
        let back = deploy("u1", "web:1.0", 3, [3, 4, 0, 4]);
        let at = w.observe(&back, s(6));
        assert!(close(at.error_ratio(), 0.4), "{at:?}");
        assert!(
            at.ok() >= ok2 && at.errors() >= err2,
            "counters went back: {at:?}"
        );
        let at = w.observe(&deploy("u1", "web:1.0", 3, [3, 4, 3, 4]), s(7));
        assert!(close(at.error_ratio(), 0.75 * 0.001 + 0.25 * 0.4), "{at:?}");
        let at = w.observe(&deploy("u1", "web:1.0", 3, [3, 4, 4, 4]), s(8));
        assert!(close(at.error_ratio(), 0.001), "{at:?}");
    }

    #[test]
    fn pods_that_never_pull_serve_nothing() {
        let t0 = Instant::now();
        let mut w = Workloads::default();
        w.observe(&deploy("u1", "web:1", 1, [1, 3, 3, 3]), t0);
        let mut stuck = deploy("u1", "unpullable.invalid/web:2-errors90", 2, [2, 4, 1, 2]);
        stuck["spec"]["replicas"] = json!(3);
        let at = w.observe(&stuck, t0 + Duration::from_secs(1));
        assert_eq!(
            at.serving(),
            Serving {
                updated: 0.0,
                old: 2.0
            }
        );
        assert!(close(at.error_ratio(), 0.001));
    }

    #[test]
    fn a_scale_is_told_from_a_new_template_and_keeps_the_share() {
        let t0 = Instant::now();
        let mut w = Workloads::default();
        let d = deploy("u1", "web:2-errors20", 1, [1, 3, 3, 3]);
        w.observe(&d, t0);
        let mut scaled = d.clone();
        scaled["metadata"]["generation"] = json!(2);
        scaled["spec"]["replicas"] = json!(5);
        assert_eq!(w.rollout(&scaled), Rollout::Scale);
        let mut retemplated = scaled.clone();
        retemplated["spec"]["template"]["metadata"]["annotations"] = json!({"restartedAt": "now"});
        assert_eq!(w.rollout(&retemplated), Rollout::Template);
        // a Deployment the controller never saw is a rollout
        assert_eq!(
            w.rollout(&deploy("u2", "web:1", 1, [0, 0, 0, 0])),
            Rollout::Template
        );
        let at = w.observe(
            &deploy("u1", "web:2-errors20", 2, [2, 5, 5, 5]),
            t0 + Duration::from_secs(1),
        );
        assert!(close(at.error_ratio(), 0.2), "{at:?}");
        assert!(close(at.serving().ready(), 5.0));
    }

    #[test]
    fn a_deployment_created_again_starts_from_zero_and_deleted_ones_are_forgotten() {
        let t0 = Instant::now();
        let mut w = Workloads::default();
        w.observe(&deploy("u1", "web:1", 1, [1, 2, 2, 2]), t0);
        let at = w.observe(
            &deploy("u1", "web:1", 1, [1, 2, 2, 2]),
            t0 + Duration::from_secs(5),
        );
        assert!(close(at.ok() + at.errors(), 100.0));
        w.sweep();
        // deleted, then created again under the same name: a new uid
        let at = w.observe(
            &deploy("u2", "web:1", 1, [1, 2, 2, 2]),
            t0 + Duration::from_secs(6),
        );
        assert_eq!(at.ok() + at.errors(), 0.0);
        w.sweep();
        assert!(w.get("u1").is_none());
        assert!(w.get("u2").is_some());
        assert_eq!(w.len(), 1);
    }
}
