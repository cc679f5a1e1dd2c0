//! The correlator judged on real Kubernetes event shapes (`multipilot-eventshapes`): every problem shape is
//! one fingerprint per object whatever its placeholders say, and over a realistic fleet stream one problem
//! is one record.

mod catalog {
    use std::collections::BTreeMap;

    use multipilot_correlator::mask::fingerprint;
    use multipilot_eventshapes::shapes::*;
    use multipilot_eventshapes::stream::{Subject, Universe};

    #[test]
    fn every_placeholder_is_typed_and_the_k3s_fixture_shapes_are_in_the_catalog() {
        for sh in SHAPES {
            for name in sh.placeholder_names() {
                assert!(
                    Placeholder::from_name(name).is_some(),
                    "{}: unknown placeholder {{{name}}} in {:?}",
                    sh.reason,
                    sh.template
                );
            }
        }
        let by_component: BTreeMap<&str, usize> =
            SHAPES.iter().fold(BTreeMap::new(), |mut m, sh| {
                *m.entry(component(sh.reporter)).or_default() += 1;
                m
            });
        assert!(
            SHAPES.len() >= 40,
            "{} shapes: {by_component:?}",
            SHAPES.len()
        );
        // the k3s v1.24 fixture's shapes are in the catalog, word for word once filled
        let fixture = [
            (
                "Pulled",
                "Container image \"{image}\" already present on machine",
            ),
            ("Created", "Created container {container}"),
            ("Started", "Started container {container}"),
            ("BackOff", "Back-off restarting failed container"),
            ("Scheduled", "Successfully assigned {ns}/{pod} to {node}"),
        ];
        for (reason, template) in fixture {
            assert!(
                SHAPES
                    .iter()
                    .any(|s| s.reason == reason && s.template == template),
                "{reason}: {template}"
            );
        }
    }

    /// The fingerprint of `n` occurrences of `shape` on `subject`, each with fresh placeholders and a fresh
    /// object (a new pod of the workload, another node of the pool, another ReplicaSet...).
    fn fingerprints(
        u: &mut Universe,
        shape: &Shape,
        subject: &Subject,
        n: usize,
    ) -> BTreeMap<String, String> {
        (0..n)
            .map(|_| {
                let o = u.occurrence(shape, subject);
                let f = fingerprint(
                    &o.cluster,
                    shape.kind.as_str(),
                    &o.namespace,
                    &o.object,
                    shape.reason,
                    &o.message,
                );
                (f, format!("{} | {}", o.object, o.message))
            })
            .collect()
    }

    #[test]
    fn every_problem_shape_is_one_fingerprint_per_object_and_apart_from_the_others() {
        let mut u = Universe::new(11);
        let mut per_shape: Vec<(usize, String)> = Vec::new();
        let mut failures = Vec::new();
        for (i, sh) in SHAPES.iter().enumerate() {
            let subjects = u.subjects_for(sh);
            let a = &subjects[0];
            // another subject in the same cluster, in the same namespace where there is one
            let b = subjects[1..]
                .iter()
                .find(|s| s.cluster() == a.cluster() && s.namespace() == a.namespace())
                .or_else(|| subjects[1..].iter().find(|s| s.cluster() == a.cluster()))
                // the ingress controller: one per cluster
                .or_else(|| subjects.get(1))
                .unwrap_or_else(|| panic!("{}: no second subject", sh.template));
            if sh.event_type == EventType::Warning || sh.problem {
                // many variations of the placeholders, on new objects of the same subject: one record
                let fa = fingerprints(&mut u, sh, a, 300);
                let fb = fingerprints(&mut u, sh, b, 100);
                if fa.len() != 1 || fb.len() != 1 {
                    let examples: Vec<&String> = fa.values().chain(fb.values()).collect();
                    failures.push(format!(
                        "{} {:?}: {} and {} fingerprints, masked e.g. {examples:#?}",
                        sh.reason,
                        sh.template,
                        fa.len(),
                        fb.len()
                    ));
                }
                // the same shape on another workload (pool): another record
                if fa.keys().any(|k| fb.contains_key(k)) {
                    failures.push(format!(
                        "{:?} on {a:?} and {b:?} share a record",
                        sh.template
                    ));
                }
            }
            // every shape once on one common object of its kind, to compare shapes on one object
            let on_common = u.common_subject(sh.kind);
            for f in fingerprints(&mut u, sh, &on_common, 1).into_keys() {
                per_shape.push((i, f));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        // two different shapes on one object are two records
        let mut owner: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, f) in &per_shape {
            if let Some(j) = owner.insert(f, *i) {
                panic!(
                    "{:?} and {:?} share a fingerprint on one object",
                    SHAPES[j].template, SHAPES[*i].template
                );
            }
        }
    }

    /// The catalogue's warnings that are one problem in several words: worded by two releases, or said
    /// several times over by a kubelet of one failure (an image that does not pull).
    const ONE_PROBLEM: [&[&str]; 3] = [
        &[
            "Back-off restarting failed container",
            "Back-off restarting failed container {container} in pod {pod}_{ns}({uuid})",
        ],
        &[
            "Unable to attach or mount volumes: unmounted volumes=[{volume}], unattached volumes=[{volume} kube-api-access-{suffix}]: timed out waiting for the condition",
            "Unable to attach or mount volumes: unmounted volumes=[{volume}], unattached volumes=[], failed to process volumes=[]: context deadline exceeded",
        ],
        &[
            "Failed to pull image \"{image}\": rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": {image}: not found",
            "Failed to pull image \"{image}\": failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": unexpected status from HEAD request to https://{image}: 401 Unauthorized",
            "Error: ErrImagePull",
            "Error: ImagePullBackOff",
        ],
    ];

    #[test]
    fn a_problem_in_several_words_is_one_fleet_problem_and_other_shapes_stay_apart() {
        use multipilot_correlator::fleet::problem_of;
        let mut u = Universe::new(5);
        // every shape once on one common object of its kind, each with fresh placeholders
        let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for sh in SHAPES {
            let o = u.occurrence(sh, &u.common_subject(sh.kind));
            let p = problem_of(
                sh.kind.as_str(),
                &o.namespace,
                &o.object,
                sh.reason,
                &o.message,
            );
            groups.entry(p).or_default().push(sh.template);
        }
        for set in ONE_PROBLEM {
            assert!(
                groups.values().any(|g| set.iter().all(|t| g.contains(t))),
                "the words for one problem are several fleet problems: {set:#?}"
            );
        }
        for g in groups.values().filter(|g| g.len() > 1) {
            let mut g = g.clone();
            g.sort();
            assert!(
                ONE_PROBLEM.iter().any(|set| {
                    let mut set = set.to_vec();
                    set.sort();
                    set == g
                }),
                "different shapes are one fleet problem: {g:#?}"
            );
        }
    }
}

mod stream {
    use std::collections::{BTreeMap, BTreeSet};

    use chrono::Duration;
    use multipilot_correlator::dedup::Dedup;
    use multipilot_eventshapes::shapes::*;
    use multipilot_eventshapes::stream::*;
    use multipilot_schemas::payload::Severity;

    #[test]
    fn the_stream_uses_every_shape_and_repeats_event_objects() {
        let mut s = ShapeStream::new(3);
        let mut shapes = BTreeSet::new();
        let mut uids: BTreeMap<String, u64> = BTreeMap::new();
        let (mut warnings, mut combined) = (0, 0);
        for _ in 0..50_000 {
            let e = s.next_event();
            shapes.insert(e.shape);
            let c = uids.entry(e.event.uid.clone()).or_default();
            *c += 1;
            assert_eq!(e.event.count, *c, "an Event object's count grows by one");
            warnings += usize::from(e.event.severity == Severity::Warning);
            combined += usize::from(e.event.message.starts_with(COMBINED_PREFIX));
            assert_eq!(e.problem.is_some(), SHAPES[e.shape].problem);
        }
        let lifecycle: Vec<_> = SHAPES
            .iter()
            .enumerate()
            .filter(|(i, s)| !s.problem && !shapes.contains(i))
            .map(|(_, s)| s.template)
            .collect();
        assert!(
            lifecycle.is_empty(),
            "lifecycle shapes never emitted: {lifecycle:?}"
        );
        let re_recorded = uids.values().filter(|n| **n > 1).count();
        assert!(
            re_recorded > 500,
            "{re_recorded} Event objects recorded more than once"
        );
        assert!(combined > 0);
        assert!(
            (0.15..0.4).contains(&(warnings as f64 / 50_000.0)),
            "{warnings} warnings: normal lifecycle dominates"
        );
    }

    /// What one run of the dedup over the stream gives.
    #[derive(Debug, Default)]
    struct Run {
        warnings: u64,
        announced: u64,
        warning_announced: u64,
        passes: u64,
        warning_passes: u64,
        records: BTreeSet<String>,
        problem_records: BTreeMap<String, BTreeSet<String>>,
        record_problems: BTreeMap<String, BTreeSet<String>>,
        problems: BTreeSet<String>,
        warning_problems: BTreeSet<String>,
        passed: BTreeSet<String>,
        told: BTreeSet<String>,
        /// Per record: passes, and first to last seen.
        record_passes: BTreeMap<String, (u64, Duration)>,
    }

    fn run(seed: u64, n: usize) -> Run {
        let mut d = Dedup::new();
        let mut s = ShapeStream::new(seed);
        let mut r = Run::default();
        for _ in 0..n {
            let e = s.next_event();
            let warning = e.event.severity >= Severity::Warning;
            r.warnings += u64::from(warning);
            let (rec, pass) = d.observe(&e.cluster, &e.event);
            r.records.insert(rec.id.clone());
            if let Some(p) = &e.problem {
                r.problems.insert(p.clone());
                if warning {
                    r.warning_problems.insert(p.clone());
                }
                r.problem_records
                    .entry(p.clone())
                    .or_default()
                    .insert(rec.id.clone());
            }
            r.record_problems
                .entry(rec.id.clone())
                .or_default()
                .insert(e.problem.clone().unwrap_or_else(|| "-".into()));
            let rp = r.record_passes.entry(rec.id.clone()).or_default();
            rp.1 = rec.last_seen - rec.first_seen;
            if let Some(pass) = pass {
                rp.0 += 1;
                r.passes += 1;
                r.warning_passes += u64::from(warning);
                if pass.is_announcement() {
                    r.announced += 1;
                    r.warning_announced += u64::from(warning);
                }
                if let Some(p) = &e.problem {
                    r.passed.insert(p.clone());
                    if warning && pass.is_announcement() {
                        r.told.insert(p.clone());
                    }
                }
            }
        }
        r
    }

    #[test]
    fn one_problem_one_record_over_the_realistic_stream() {
        let r = run(42, 50_000);
        let reduction = |n: u64| 1.0 - n as f64 / r.warnings as f64;
        // what an operator is told: digests go out for warnings (machine.rs), announcements only
        assert!(
            reduction(r.warning_announced) >= 0.95,
            "{} announcements for {} warning events",
            r.warning_announced,
            r.warnings
        );
        // every digest published (machine.rs publishes warnings' passes), in-place updates included: a
        // problem that keeps recurring over the stream's 83 minutes is updated every 5 min, so this is
        // less than for announcements, and never more than the refresh policy allows a record
        assert!(
            reduction(r.warning_passes) >= 0.80,
            "{} digests (announcements and updates) for {} warning events",
            r.warning_passes,
            r.warnings
        );
        for (id, (passes, span)) in &r.record_passes {
            let allowed = 1 + span.num_seconds() / 300;
            assert!(
                *passes as i64 <= allowed,
                "record {id}: {passes} passes over {span}"
            );
        }
        let missed: Vec<_> = r.problems.difference(&r.passed).collect();
        assert!(missed.is_empty(), "problems never passed on: {missed:?}");
        let untold: Vec<_> = r.warning_problems.difference(&r.told).collect();
        assert!(
            untold.is_empty(),
            "warning problems never announced: {untold:?}"
        );
        // no record holds two problems, nor a problem and normal traffic
        let shared: Vec<_> = r
            .record_problems
            .iter()
            .filter(|(_, ps)| ps.len() > 1 && ps.iter().any(|p| p != "-"))
            .collect();
        assert!(shared.is_empty(), "records shared by problems: {shared:?}");
        // a record per problem
        let split: Vec<_> = r
            .problem_records
            .iter()
            .filter(|(_, rs)| rs.len() > 1)
            .map(|(p, rs)| (p, rs.len()))
            .collect();
        assert!(split.is_empty(), "problems split over records: {split:?}");
        assert!(
            r.problems.len() > 150,
            "{} distinct problems",
            r.problems.len()
        );
    }
}
