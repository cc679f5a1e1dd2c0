//! Event fingerprints: the same problem reported with different numbers, durations, hashes, pod-template
//! suffixes, IPs or UIDs gets the same id.

use multipilot_schemas::stable_id;

fn is_hex(s: &str) -> bool {
    s.chars().all(|c| c.is_ascii_hexdigit())
}

const SUFFIX_ALPHABET: &str = "bcdfghjklmnpqrstvwxz2456789";

/// What a pod-template-hash is made of: the decimal FNV-32 hash through `rand.SafeEncodeString`, which maps
/// `0`–`9` to `4 5 6 7 8 9 b c d f`. One made only of digits 6–9 has no digit left (`bcdfbbdcfd`), a small
/// hash is short (`dbd4b`), and no word is spelt with b, c, d, f and those digits alone.
const TEMPLATE_HASH_ALPHABET: &str = "456789bcdf";

/// A word followed by a long number (`nginx-cfg3712301224`, `vmss000009`): a counter or a random temp-file
/// name; the word is kept.
fn counter_head(p: &str) -> Option<&str> {
    let head = p.trim_end_matches(|c: char| c.is_ascii_digit());
    let digits = p.len() - head.len();
    (digits >= 6 && !head.is_empty() && head.chars().all(|c| c.is_ascii_alphabetic()))
        .then_some(head)
}

fn is_uuid_at(b: &[u8], i: usize) -> bool {
    const SHAPE: [usize; 5] = [8, 4, 4, 4, 12];
    let mut pos = i;
    for (n, len) in SHAPE.iter().enumerate() {
        if pos + len > b.len() || !b[pos..pos + len].iter().all(u8::is_ascii_hexdigit) {
            return false;
        }
        pos += len;
        if n < 4 {
            if b.get(pos) != Some(&b'-') {
                return false;
            }
            pos += 1;
        }
    }
    true
}

/// Replaces every UUID inside `s` with `*`.
fn mask_uuids(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if is_uuid_at(b, i) {
            out.push('*');
            i += 36;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// A name's generated parts (`web-7d4b9c8f5-x2x9k` → `web-*`, `nightly-28790640-abcde` → `nightly-*`,
/// `prometheus-0` → `prometheus-*`, `pvc-<uuid>` → `pvc-*`): numbers, hex hashes and UUIDs anywhere, and
/// a last part made of the random-suffix alphabet Kubernetes uses.
pub fn mask_name(name: &str) -> String {
    let name = mask_uuids(name);
    let parts: Vec<&str> = name.split('-').collect();
    let last = parts.len().saturating_sub(1);
    let mut out: Vec<String> = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let digits = p.chars().any(|c| c.is_ascii_digit());
        let generated = *p == "*"
            || (!p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
            || (p.len() >= 6 && digits && is_hex(p))
            // an abbreviated commit (git's 7+) may have no digit: `sha-cafebad`
            || (p.len() >= 7 && is_hex(p))
            || (p.len() >= 5 && p.chars().all(|c| TEMPLATE_HASH_ALPHABET.contains(c)))
            || (i == last
                && i > 0
                && p.len() == 5
                && p.chars().all(|c| SUFFIX_ALPHABET.contains(c)));
        let piece = if generated {
            "*".to_string()
        } else if let Some(head) = counter_head(p) {
            format!("{head}*")
        } else {
            p.to_string()
        };
        if piece == "*" && out.last().is_some_and(|l| l == "*") {
            continue;
        }
        out.push(piece);
    }
    out.join("-")
}

/// Masks the volatile parts of a message: numbers (with units and durations), hex hashes, UUIDs, IPs and
/// generated name suffixes become `*`. The message is cut into runs of name characters (letters, digits,
/// `-`, `.`) and everything else; each run is judged alone.
///
/// Two rewrites that change no problem come first: client-go's aggregate prefix (`(combined from similar
/// events): `, which its event recorder puts on a message when ten similar ones differ only in their text)
/// is dropped, and so is an image reference's digest pin (`@sha256:<64 hex>`: pinned or not, it is the
/// same image, whose tag is masked anyway).
pub fn mask_message(msg: &str) -> String {
    let msg = msg.strip_prefix(COMBINED_PREFIX).unwrap_or(msg);
    let msg = strip_digest_pins(msg);
    let mut out = String::with_capacity(msg.len());
    let mut run = String::new();
    for ch in msg.chars() {
        if ch.is_ascii_alphanumeric() || ch == '-' || ch == '.' {
            run.push(ch);
        } else {
            if !run.is_empty() {
                out.push_str(&mask_run(&run));
                run.clear();
            }
            out.push(ch);
        }
    }
    if !run.is_empty() {
        out.push_str(&mask_run(&run));
    }
    out
}

/// A message as [`mask_message`] masks it, in the words every supported Kubernetes release uses for it and
/// one form for the several messages of one failure: the form fleet problems are compared in
/// ([`crate::fleet::problem`]).
///
/// Kubelets of different releases word some warnings differently (each form is in the event shape
/// catalogue, `services/eventshapes`, with its source). On a fleet of mixed releases one problem then comes
/// in several wordings, and compared word for word it was one fleet problem per wording: a workload
/// crashlooping on six clusters was two fleet incidents, the 1.24–1.25 clusters' and the others', each
/// with "shared" attributes that only told the releases apart. And a kubelet says some failures several
/// times over, in one reason: an image that never pulls is `Failed to pull image …`, `Error: ErrImagePull`
/// and `Error: ImagePullBackOff` on each pod — three fleet incidents saying the same, compared message by
/// message. Each is brought back to the words its forms share; any other message is the masked message
/// itself (another cause in the same reason — a missing secret beside a pull that fails — stays another
/// problem). A cluster's own records keep the message as it came.
pub fn fleet_message(msg: &str) -> String {
    let masked = mask_message(msg);
    common_form(&masked).unwrap_or(masked)
}

/// The form a masked warning shares with the other words for its failure, for the warnings that have
/// some. (Lifecycle events reworded too — `Created container:` since 1.32, `Pulled` — but only warnings
/// become fleet problems.)
fn common_form(m: &str) -> Option<String> {
    // `Back-off restarting failed container %s in pod %s` since 1.26, bare before: the bare form names no
    // container, so a workload's crashing containers are one problem on every release
    const BACK_OFF: &str = "Back-off restarting failed container";
    // `Unable to attach or mount volumes: unmounted volumes=[%s], unattached volumes=[%s]: timed out
    // waiting for the condition`, since 1.26 `..., failed to process volumes=[%s]: context deadline
    // exceeded`: the same timeout on the same volumes. Any other tail (an error of the pod's volumes)
    // is a problem of its own and left as it is.
    const MOUNT: &str = "Unable to attach or mount volumes: unmounted volumes=[";
    const MOUNT_TIMEOUTS: [&str; 2] = [
        ": timed out waiting for the condition",
        ": context deadline exceeded",
    ];
    // an image that does not pull, whatever the registry said (not found, unauthorized): the image
    // manager's `Failed to pull image %q: %v` (`pkg/kubelet/images/image_manager.go`), then the
    // container's start failing with the pull's state, as it fails and as it backs off (`Error: %v`,
    // `pkg/kubelet/kuberuntime/kuberuntime_container.go`); every other `Error: …` is a cause of its own
    const PULL: &str = "Failed to pull image";
    const PULL_STATES: [&str; 2] = ["Error: ErrImagePull", "Error: ImagePullBackOff"];
    if m.starts_with(BACK_OFF) {
        return Some(BACK_OFF.to_string());
    }
    if m.starts_with(PULL) || PULL_STATES.contains(&m) {
        return Some(PULL.to_string());
    }
    if let Some(rest) = m.strip_prefix(MOUNT)
        && MOUNT_TIMEOUTS.iter().any(|t| rest.ends_with(t))
    {
        let end = MOUNT.len() + rest.find(']')? + 1;
        return Some(m[..end].to_string());
    }
    None
}

/// The prefix of an event message aggregated by client-go (`tools/record/events_cache.go`).
const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// Drops every `@sha256:<64 hex>` digest pin.
fn strip_digest_pins(msg: &str) -> std::borrow::Cow<'_, str> {
    const PIN: &str = "@sha256:";
    if !msg.contains(PIN) {
        return std::borrow::Cow::Borrowed(msg);
    }
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(i) = rest.find(PIN) {
        let after = &rest[i + PIN.len()..];
        let hex = after.bytes().take_while(u8::is_ascii_hexdigit).count();
        if hex == 64 {
            out.push_str(&rest[..i]);
            rest = &after[hex..];
        } else {
            out.push_str(&rest[..i + PIN.len()]);
            rest = after;
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

fn mask_run(run: &str) -> String {
    let core = run.trim_end_matches('.');
    let tail = &run[core.len()..];
    if !core.chars().any(|c| c.is_ascii_digit()) {
        let masked = if core.contains('-') {
            mask_name(core)
        } else {
            core.to_string()
        };
        return format!("{masked}{tail}");
    }
    let uuid_like = core.len() == 36 && is_uuid_at(core.as_bytes(), 0);
    let numeric = core
        .trim_start_matches(['+', '-'])
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit());
    let hexy = core.len() >= 6 && is_hex(core);
    let masked = if uuid_like || numeric || hexy || is_version(core) {
        "*".to_string()
    } else if core.contains('-') {
        mask_name(core)
    } else if let Some(head) = counter_head(core) {
        format!("{head}*")
    } else {
        // digits inside a word (web3, v1beta1) name things: kept
        core.to_string()
    };
    format!("{masked}{tail}")
}

/// A release version as image tags and components carry it: `v1.7.12`, `v0.14.5-rc.1`, `v2.1+build.3`
/// (`v1beta1`, an API version, is not one: it names a thing).
fn is_version(core: &str) -> bool {
    let Some(rest) = core.strip_prefix(['v', 'V']) else {
        return false;
    };
    let main = rest.split(['-', '+']).next().unwrap_or("");
    let mut parts = main.split('.');
    let all_digits = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit());
    parts.clone().count() >= 2 && parts.all(all_digits)
}

/// The stable id of a problem: cluster, involved kind, namespace, masked name, reason, masked message.
pub fn fingerprint(
    cluster: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    reason: &str,
    message: &str,
) -> String {
    stable_id(&[
        cluster,
        kind,
        namespace,
        &mask_name(name),
        reason,
        &mask_message(message),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_suffixes_are_masked() {
        assert_eq!(mask_name("web-7d4b9c8f5-x2x9k"), "web-*");
        assert_eq!(mask_name("prometheus-0"), "prometheus-*");
        assert_eq!(
            mask_name("nightly-report-28790640-bq7tz"),
            "nightly-report-*"
        );
        // a pod-template-hash without a digit left, a temp file's and an instance's counter
        assert_eq!(mask_name("web-bcdfbbdcfd-x2x9k"), "web-*");
        assert_eq!(mask_name("api-dbd4b-2wpsl"), "api-*");
        assert_eq!(mask_name("sha-cafebad"), "sha-*");
        assert_eq!(mask_name("decade-facade"), "decade-facade");
        assert_eq!(mask_name("nginx-cfg3712301224"), "nginx-cfg*");
        assert_eq!(
            mask_name("aks-nodepool1-42814270-vmss000009"),
            "aks-nodepool1-*-vmss*"
        );
        // short numbers inside words name things
        assert_eq!(mask_name("redis-cache"), "redis-cache");
        assert_eq!(mask_name("python3-worker"), "python3-worker");
        assert_eq!(mask_name("coredns"), "coredns");
        assert_eq!(mask_name("kube-proxy"), "kube-proxy");
        assert_eq!(
            mask_name("ingress-nginx-controller"),
            "ingress-nginx-controller"
        );
    }

    #[test]
    fn volatile_parts_of_messages_are_masked() {
        let a = mask_message(
            "back-off 5m0s restarting failed container=web pod=web-7d4b9c8f5-x2x9k_shop(0b5c1e6a-4d2f-4c1e-9a43-2b7f0c6d1e11)",
        );
        let b = mask_message(
            "back-off 2m40s restarting failed container=web pod=web-7d4b9c8f5-bq7tz_shop(1b5c1e6a-4d2f-4c1e-9a43-2b7f0c6d1e12)",
        );
        assert_eq!(a, b);
        assert_eq!(
            mask_message(
                "Readiness probe failed: Get \"http://10.244.1.17:8080/healthz\": dial tcp 10.244.1.17:8080: connect: connection refused"
            ),
            mask_message(
                "Readiness probe failed: Get \"http://10.244.3.9:8080/healthz\": dial tcp 10.244.3.9:8080: connect: connection refused"
            )
        );
        assert_eq!(
            mask_message("0/6 nodes are available: 3 Insufficient cpu."),
            mask_message("0/7 nodes are available: 4 Insufficient cpu.")
        );
        assert_ne!(
            mask_message("Insufficient cpu"),
            mask_message("Insufficient memory")
        );
        // image tags and versions vary between occurrences of one pull problem
        let pull = |tag: &str| {
            mask_message(&format!(
                "Failed to pull image \"registry.example.com/shop/api:{tag}\": rpc error: code = NotFound desc = manifest unknown"
            ))
        };
        assert_eq!(pull("v1.7.12"), pull("v1.3.15"));
        assert_eq!(pull("v0.14.5-rc.1"), pull("v2.0.0"));
        assert_eq!(pull("1.27-alpine"), pull("1.25-alpine"));
        assert_eq!(
            mask_message("Container image \"alpine:3\" already present on machine"),
            mask_message("Container image \"alpine:4\" already present on machine")
        );
        // digests, quantities and ports
        assert_eq!(
            mask_message(
                "pulling image@sha256:3f1c2e9a8b7d6c5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e"
            ),
            mask_message(
                "pulling image@sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"
            )
        );
        assert_eq!(
            mask_message("limit cpu 500m memory 2Gi exceeded on port 8080"),
            mask_message("limit cpu 250m memory 512Mi exceeded on port 9090")
        );
        // client-go's aggregate prefix and an image's digest pin change no problem
        assert_eq!(
            mask_message(
                "(combined from similar events): Error creating: pods \"web-7d4b9c8f5-xwvqs\" is forbidden: exceeded quota: compute, requested: cpu=500m, used: cpu=1900m, limited: cpu=2"
            ),
            mask_message(
                "Error creating: pods \"web-7d4b9c8f5-q8w7r\" is forbidden: exceeded quota: compute, requested: cpu=250m, used: cpu=1750m, limited: cpu=2"
            )
        );
        assert_eq!(
            mask_message(
                "Back-off pulling image \"shop/api:v1.2.3@sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9\""
            ),
            mask_message("Back-off pulling image \"shop/api:v1.2.4\"")
        );
        assert_eq!(
            mask_message("pod triggered scale-up: [{general 3->5 (max: 10)}]"),
            mask_message("pod triggered scale-up: [{general 1->2 (max: 12)}]")
        );
        assert_ne!(
            mask_message("Back-off pulling image \"shop/api:v1.2.3\""),
            mask_message("Back-off pulling image \"shop/web:v1.2.3\"")
        );
        // an API version names a thing and stays
        assert_ne!(
            mask_message("no matches for kind CronJob in version batch/v1beta1"),
            mask_message("no matches for kind CronJob in version batch/v1")
        );
    }

    #[test]
    fn fingerprint_ignores_noise_but_not_the_problem() {
        let f = |name: &str, msg: &str| fingerprint("c1", "Pod", "shop", name, "BackOff", msg);
        assert_eq!(
            f(
                "web-7d4b9c8f5-x2x9k",
                "Back-off restarting failed container web in pod web-7d4b9c8f5-x2x9k"
            ),
            f(
                "web-7d4b9c8f5-q8w7r",
                "Back-off restarting failed container web in pod web-7d4b9c8f5-q8w7r"
            )
        );
        assert_ne!(f("web-7d4b9c8f5-x2x9k", "x"), f("api-6c5b4a3f2-x2x9k", "x"));
        assert_ne!(
            fingerprint("c1", "Pod", "shop", "web", "BackOff", "x"),
            fingerprint("c2", "Pod", "shop", "web", "BackOff", "x")
        );
    }

    #[test]
    fn a_fleet_message_has_every_releases_words() {
        // the messages as a 1.24 and a 1.33 kubelet write them (the simulator's, as in the catalogue)
        let old = fleet_message("Back-off restarting failed container");
        let new = fleet_message(
            "Back-off restarting failed container web in pod web-c549d3a4cd-h5sjg_catalog(27cd5a7f-596e-464f-a5f6-ade4d24034cd)",
        );
        assert_eq!(old, new);
        let timed_out = "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[data kube-api-access-x2x9k]: timed out waiting for the condition";
        assert_eq!(
            fleet_message(timed_out),
            fleet_message(
                "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process volumes=[]: context deadline exceeded"
            )
        );
        // other volumes, or another cause than the timeout: another problem
        assert_ne!(
            fleet_message(timed_out),
            fleet_message(
                "Unable to attach or mount volumes: unmounted volumes=[logs], unattached volumes=[logs kube-api-access-x2x9k]: timed out waiting for the condition"
            )
        );
        let unbound = "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[data]: error processing PVC shop/data: PVC is not bound";
        assert_eq!(fleet_message(unbound), mask_message(unbound));
        assert_ne!(fleet_message(unbound), fleet_message(timed_out));
        // an image that never pulls, in each of the kubelet's words for it: one form
        let image = "registry.example.com/shop/web:1.4.2";
        let pulls = [
            format!(
                "Failed to pull image \"{image}\": rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": {image}: not found"
            ),
            format!(
                "Failed to pull image \"{image}\": failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": unexpected status from HEAD request to https://{image}: 401 Unauthorized"
            ),
            "Error: ErrImagePull".to_string(),
            "Error: ImagePullBackOff".to_string(),
        ];
        for p in &pulls {
            assert_eq!(fleet_message(p), fleet_message(&pulls[0]), "{p}");
        }
        // another cause in the same reason stays apart
        let secret = "Error: secret \"web-tls\" not found";
        assert_eq!(fleet_message(secret), mask_message(secret));
        assert_ne!(fleet_message(secret), fleet_message(&pulls[0]));
        // other messages are masked and nothing more: another back-off, another problem
        let pull = format!("Back-off pulling image \"{image}\"");
        assert_eq!(fleet_message(&pull), mask_message(&pull));
        assert_ne!(fleet_message(&pull), old);
        assert_eq!(
            fleet_message("Created container: web"),
            mask_message("Created container: web")
        );
    }
}
