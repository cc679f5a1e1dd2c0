//! Health that people define: whether an object of a kind the role has no judgement of its own for (a
//! cert-manager `Certificate`, an Argo `Rollout`, a Flux `HelmRelease`, a CloudNativePG `Cluster`, a
//! `Job`, …) is healthy, still progressing or failed, by a rule written in CEL over the object. CEL is
//! what Kubernetes validates objects with (`x-kubernetes-validations`) and, as there, the object is `self`
//! (also bound as `object`). Pure: no I/O; the role reads the live objects and asks [`Rules::judge`].
//!
//! A rule is for one kind, named `group/Kind` without the version (`cert-manager.io/Certificate`,
//! `batch/Job`; a core kind is just `Kind`, `PersistentVolumeClaim`), or for many: the group may start with
//! `*.` and the kind may be `*` (`*.upbound.io/*`, every Crossplane managed resource of Upbound's
//! providers). The most specific rule judges: `group/Kind`, else `group/*`, else the `*.suffix` patterns,
//! the longest suffix first and, for one suffix, `Kind` before `*`. A rule has up to three expressions:
//!
//! - `healthy` (bool, required): the object is where the release wanted it;
//! - `failed` (bool): it will not get there without someone changing something — stop waiting;
//! - `message` (string): what it is doing now, reported while it is progressing or failed (a condition's
//!   message, a phase).
//!
//! [`Rules::judge`] evaluates `failed` first, then `healthy`: [`Health::Failed`] with the message,
//! [`Health::Healthy`], else [`Health::Progressing`] with the message. An expression that can't be evaluated
//! on an object (a field it reads without `has()` is absent, a value of another type) or gives something
//! else than its type makes the object progressing with that error as the reason — never a panic; the
//! health gate's timeout ends the wait. A kind without a rule is [`Health::Unknown`], "no health", as
//! before this module: the gate does not wait on it. A JSON `null` field counts as absent (`has()` is false).
//!
//! The rules shipped ([`shipped_rules`]) follow what Argo CD calls healthy for each kind (its resource
//! health scripts, <https://github.com/argoproj/argo-cd/tree/master/resource_customizations>, and the
//! built-in checks of <https://github.com/argoproj/gitops-engine/tree/master/pkg/health>), each rule's
//! comment says where and why it differs. Operators add rules for their own kinds, or replace a shipped
//! one, in the hub config; a rule whose `healthy` is `true` turns waiting off for a kind:
//!
//! ```yaml
//! release:
//!   health_rules:
//!     # a kind of their own
//!     - kind: databases.example.com/Database
//!       healthy: has(self.status) && has(self.status.state) && self.status.state == 'Available'
//!       failed: has(self.status) && has(self.status.state) && self.status.state == 'Error'
//!       message: "has(self.status) && has(self.status.detail) ? self.status.detail : 'no status yet'"
//!     # replaces the shipped rule: a claim whose class binds on first use is fine while Pending
//!     - kind: PersistentVolumeClaim
//!       healthy: has(self.status) && has(self.status.phase) && self.status.phase in ['Bound', 'Pending']
//! ```
//!
//! Every expression is compiled when the rules are loaded; one that does not parse, or that names a
//! variable other than `self` and `object` (as `obj`, which Argo CD's Lua scripts use), is refused with its
//! kind named ([`Error`]). The standard CEL library is there with the `strings`, `lists` and `math`
//! extensions (as in Kubernetes' CEL); a function that does not exist shows only when it is evaluated.
//! [`Rules`] is built once (when the config is loaded) and shared: it is `Send + Sync`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use cel::objects::{Key as CelKey, Map as CelMap};
use cel::{Context, Env, Program, Value as Cel};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A health rule as written in the hub config (`release.health_rules`) or shipped with the role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthRule {
    /// The kind it judges: `group/Kind` without the version (`cert-manager.io/Certificate`), `Kind` for the
    /// core group, `*.` before a group suffix and `*` as the kind for many (`*.upbound.io/*`).
    pub kind: String,
    /// CEL, a bool: the object is healthy. The object is `self` (and `object`).
    pub healthy: String,
    /// CEL, a bool: the object has failed and will not get healthy by waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// CEL, a string: what the object is doing, reported while it is not healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl HealthRule {
    /// A rule with only `healthy`.
    pub fn new(kind: impl Into<String>, healthy: impl Into<String>) -> Self {
        HealthRule {
            kind: kind.into(),
            healthy: healthy.into(),
            failed: None,
            message: None,
        }
    }

    /// With a `failed` expression.
    pub fn failed(mut self, failed: impl Into<String>) -> Self {
        self.failed = Some(failed.into());
        self
    }

    /// With a `message` expression.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }
}

/// What a rule says of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Its `healthy` expression holds.
    Healthy,
    /// Not healthy yet, and why: the rule's message, or the error an expression gave.
    Progressing(String),
    /// Its `failed` expression holds: waiting longer won't help. Why: the rule's message.
    Failed(String),
    /// No rule for its kind: "no health", nothing to wait for.
    Unknown,
}

impl Health {
    /// `healthy`, `progressing`, `failed` or `unknown`.
    pub fn name(&self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Progressing(_) => "progressing",
            Health::Failed(_) => "failed",
            Health::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Health::Healthy => f.write_str("healthy"),
            Health::Progressing(why) => write!(f, "progressing: {why}"),
            Health::Failed(why) => write!(f, "failed: {why}"),
            Health::Unknown => f.write_str("no health (no rule for its kind)"),
        }
    }
}

/// A health rule that can't be used: which kind and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kind is not `group/Kind`.
    #[error(
        "health rule for {kind:?}: {reason} (write group/Kind without the version: \
         cert-manager.io/Certificate, batch/Job, PersistentVolumeClaim, *.upbound.io/*)"
    )]
    Kind {
        /// The kind as written.
        kind: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An expression does not parse.
    #[error("health rule for {kind}: {field} does not compile: {source}")]
    Compile {
        /// The rule's kind.
        kind: String,
        /// `healthy`, `failed` or `message`.
        field: &'static str,
        /// What the CEL parser found.
        #[source]
        source: cel::ParseErrors,
    },
    /// An expression names a variable that is not there.
    #[error(
        "health rule for {kind}: {field} does not compile: it names {name:?}, which is not a variable \
         (the object is `self`, or `object`)"
    )]
    UnknownName {
        /// The rule's kind.
        kind: String,
        /// `healthy`, `failed` or `message`.
        field: &'static str,
        /// The name.
        name: String,
    },
    /// Two rules of the same list are for the same kind.
    #[error("two health rules for {kind}")]
    Duplicate {
        /// The kind.
        kind: String,
    },
}

impl Error {
    /// Never: a rule that doesn't compile needs the config changed.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// A reason longer than this is cut (a Helm error can be pages long); the gate's report joins one per object.
const MAX_REASON: usize = 400;

/// The group part of a rule's kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    /// This group (`""`: the core group).
    Exact(String),
    /// Any group ending with this (`.upbound.io` for `*.upbound.io`).
    Suffix(String),
}

/// What a rule is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct KindKey {
    group: Group,
    /// `None`: any kind (`*`).
    kind: Option<String>,
}

impl KindKey {
    fn parse(text: &str) -> Result<KindKey> {
        let bad = |reason| Error::Kind {
            kind: text.to_string(),
            reason,
        };
        let (group, kind) = text.split_once('/').unwrap_or(("", text));
        if kind.contains('/') {
            return Err(bad("more than one '/' (a version?)"));
        }
        let kind = match kind {
            "*" => None,
            k if k.starts_with(|c: char| c.is_ascii_uppercase())
                && k.chars().all(|c| c.is_ascii_alphanumeric()) =>
            {
                Some(k.to_string())
            }
            "" => return Err(bad("no kind")),
            _ => {
                return Err(bad(
                    "the kind is the CamelCase kind (Certificate), not the resource (certificates)",
                ));
            }
        };
        let group_chars = |g: &str| {
            !g.is_empty()
                && g.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        };
        let group = match group.strip_prefix('*') {
            Some(suffix) if suffix.starts_with('.') && group_chars(&suffix[1..]) => {
                Group::Suffix(suffix.to_string())
            }
            Some(_) => return Err(bad("a group pattern is *.suffix (*.upbound.io)")),
            None if group.is_empty() || group_chars(group) => Group::Exact(group.to_string()),
            None => return Err(bad("the group is lower-case letters, digits, '.' and '-'")),
        };
        if group == Group::Exact(String::new()) && kind.is_none() {
            return Err(bad("every core kind at once is not a rule"));
        }
        Ok(KindKey { group, kind })
    }

    fn matches(&self, group: &str, kind: &str) -> bool {
        let group_ok = match &self.group {
            Group::Exact(g) => g == group,
            Group::Suffix(s) => group.ends_with(s.as_str()),
        };
        group_ok && self.kind.as_deref().is_none_or(|k| k == kind)
    }

    /// Higher is more specific.
    fn rank(&self) -> (u8, usize, u8) {
        match &self.group {
            Group::Exact(g) => (1, g.len(), u8::from(self.kind.is_some())),
            Group::Suffix(s) => (0, s.len(), u8::from(self.kind.is_some())),
        }
    }
}

impl fmt::Display for KindKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.group {
            Group::Exact(g) if g.is_empty() => {}
            Group::Exact(g) => write!(f, "{g}/")?,
            Group::Suffix(s) => write!(f, "*{s}/")?,
        }
        f.write_str(self.kind.as_deref().unwrap_or("*"))
    }
}

/// One expression, compiled.
struct Expression {
    program: Program,
    /// Which of `self` and `object` it reads (the object is converted for those only).
    uses_self: bool,
    uses_object: bool,
}

/// A rule, compiled.
struct Compiled {
    rule: HealthRule,
    healthy: Expression,
    failed: Option<Expression>,
    message: Option<Expression>,
}

impl Compiled {
    fn expressions(&self) -> impl Iterator<Item = &Expression> {
        std::iter::once(&self.healthy)
            .chain(self.failed.as_ref())
            .chain(self.message.as_ref())
    }
}

/// The health rules in force, compiled: what [`Rules::judge`] asks.
pub struct Rules {
    env: Arc<Env>,
    exact: BTreeMap<(String, String), Compiled>,
    /// Rules with a pattern, the most specific first.
    patterns: Vec<(KindKey, Compiled)>,
}

impl fmt::Debug for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rules")
            .field("kinds", &self.kinds())
            .finish()
    }
}

impl Default for Rules {
    /// The shipped rules.
    fn default() -> Self {
        Rules::shipped()
    }
}

/// The CEL environment rules are compiled and evaluated in.
fn environment() -> Env {
    let mut env = Env::stdlib();
    // what Kubernetes' CEL also offers; none of their names is in the standard library
    for extension in [
        cel::extensions::strings,
        cel::extensions::lists,
        cel::extensions::math,
    ] {
        env.add_extension(extension)
            .expect("the CEL extensions declare different functions");
    }
    env
}

impl Rules {
    /// The rules shipped with the role ([`shipped_rules`]).
    pub fn shipped() -> Rules {
        Rules::compile(shipped_rules()).expect("the shipped health rules compile (tested)")
    }

    /// The shipped rules with the operator's on top: a configured rule replaces the shipped one for the same
    /// kind. Fails on the first rule that does not compile, naming its kind, and on a kind configured twice.
    pub fn load(configured: &[HealthRule]) -> Result<Rules> {
        let mut keys = std::collections::BTreeSet::new();
        for rule in configured {
            let key = KindKey::parse(&rule.kind)?;
            if !keys.insert(key.clone()) {
                return Err(Error::Duplicate {
                    kind: key.to_string(),
                });
            }
        }
        let shipped = shipped_rules()
            .into_iter()
            .filter(|r| KindKey::parse(&r.kind).map_or(true, |key| !keys.contains(&key)));
        Rules::compile(shipped.chain(configured.iter().cloned()))
    }

    /// Exactly these rules (no shipped ones), each kind once.
    pub fn compile(rules: impl IntoIterator<Item = HealthRule>) -> Result<Rules> {
        let env = Arc::new(environment());
        let mut exact = BTreeMap::new();
        let mut patterns: Vec<(KindKey, Compiled)> = Vec::new();
        for rule in rules {
            let key = KindKey::parse(&rule.kind)?;
            let name = key.to_string();
            let compile = |field: &'static str, source: &str| -> Result<Expression> {
                let program = env.compile(source).map_err(|source| Error::Compile {
                    kind: name.clone(),
                    field,
                    source,
                })?;
                if let Some(unknown) = unknown_name(program.expression(), &mut Vec::new()) {
                    return Err(Error::UnknownName {
                        kind: name.clone(),
                        field,
                        name: unknown,
                    });
                }
                let refs = program.references();
                Ok(Expression {
                    uses_self: refs.has_variable("self"),
                    uses_object: refs.has_variable("object"),
                    program,
                })
            };
            let compiled = Compiled {
                healthy: compile("healthy", &rule.healthy)?,
                failed: rule
                    .failed
                    .as_deref()
                    .map(|s| compile("failed", s))
                    .transpose()?,
                message: rule
                    .message
                    .as_deref()
                    .map(|s| compile("message", s))
                    .transpose()?,
                rule,
            };
            let duplicate = match (&key.group, &key.kind) {
                (Group::Exact(g), Some(k)) => {
                    exact.insert((g.clone(), k.clone()), compiled).is_some()
                }
                _ if patterns.iter().any(|(k, _)| *k == key) => true,
                _ => {
                    patterns.push((key, compiled));
                    false
                }
            };
            if duplicate {
                return Err(Error::Duplicate { kind: name });
            }
        }
        patterns.sort_by_key(|(key, _)| std::cmp::Reverse(key.rank()));
        Ok(Rules {
            env,
            exact,
            patterns,
        })
    }

    /// The rule for objects of this `apiVersion` (`cert-manager.io/v1`, `v1`) and kind.
    fn find(&self, api_version: &str, kind: &str) -> Option<&Compiled> {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        self.exact
            .get(&(group.to_string(), kind.to_string()))
            .or_else(|| {
                self.patterns
                    .iter()
                    .find(|(key, _)| key.matches(group, kind))
                    .map(|(_, c)| c)
            })
    }

    /// Whether a rule judges objects of this `apiVersion` and kind ([`Rules::judge`] says
    /// [`Health::Unknown`] for the others).
    pub fn knows(&self, api_version: &str, kind: &str) -> bool {
        self.find(api_version, kind).is_some()
    }

    /// The rule that judges objects of this `apiVersion` and kind, as written.
    pub fn rule_for(&self, api_version: &str, kind: &str) -> Option<&HealthRule> {
        self.find(api_version, kind).map(|c| &c.rule)
    }

    /// The kinds with a rule (as written in rules: `cert-manager.io/Certificate`, `*.upbound.io/*`).
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self
            .exact
            .keys()
            .map(|(g, k)| {
                KindKey {
                    group: Group::Exact(g.clone()),
                    kind: Some(k.clone()),
                }
                .to_string()
            })
            .chain(self.patterns.iter().map(|(k, _)| k.to_string()))
            .collect();
        kinds.sort();
        kinds
    }

    /// What the rule for the object's kind says of it (the object as read from the cluster, with its
    /// `apiVersion`, `kind` and `status`). [`Health::Unknown`] when no rule is for its kind.
    pub fn judge(&self, obj: &Value) -> Health {
        let text = |k: &str| obj.get(k).and_then(Value::as_str);
        let (Some(api_version), Some(kind)) = (text("apiVersion"), text("kind")) else {
            return Health::Unknown;
        };
        let Some(rule) = self.find(api_version, kind) else {
            return Health::Unknown;
        };
        let mut cx = Context::with_env(Arc::clone(&self.env));
        let (uses_self, uses_object) = rule.expressions().fold((false, false), |(s, o), e| {
            (s || e.uses_self, o || e.uses_object)
        });
        if uses_self || uses_object {
            let value = to_cel(obj);
            if uses_self {
                cx.add_variable_from_value("self", value.clone());
            }
            if uses_object {
                cx.add_variable_from_value("object", value);
            }
        }
        let reason = |fallback: &str| {
            let message = rule
                .message
                .as_ref()
                .and_then(|m| match m.program.execute(&cx) {
                    Ok(Cel::String(s)) if !s.trim().is_empty() => Some(s.to_string()),
                    _ => None,
                });
            one_line(message.as_deref().unwrap_or(fallback))
        };
        if let Some(failed) = &rule.failed {
            match boolean(&failed.program, &cx) {
                Ok(true) => return Health::Failed(reason("its failed rule holds")),
                Ok(false) => {}
                Err(e) => return Health::Progressing(one_line(&format!("failed rule: {e}"))),
            }
        }
        match boolean(&rule.healthy.program, &cx) {
            Ok(true) => Health::Healthy,
            Ok(false) => Health::Progressing(reason("not healthy yet")),
            Err(e) => Health::Progressing(one_line(&format!("healthy rule: {e}"))),
        }
    }
}

/// Why an expression gave no bool.
#[derive(Debug)]
enum NotBool {
    /// It could not be evaluated on this object.
    Error(cel::ExecutionError),
    /// It gave a value of another type.
    Type(Cel),
}

impl fmt::Display for NotBool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotBool::Error(e) => write!(f, "{e}"),
            NotBool::Type(v) => write!(f, "gave {}, not a bool", v.type_of()),
        }
    }
}

fn boolean(program: &Program, cx: &Context) -> std::result::Result<bool, NotBool> {
    match program.execute(cx) {
        Ok(Cel::Bool(b)) => Ok(b),
        Ok(other) => Err(NotBool::Type(other)),
        Err(e) => Err(NotBool::Error(e)),
    }
}

/// Whitespace runs as one space, cut at [`MAX_REASON`] characters.
fn one_line(s: &str) -> String {
    let mut out = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some((cut, _)) = out.char_indices().nth(MAX_REASON) {
        out.truncate(cut);
        out.push('…');
    }
    out
}

/// The object as a CEL value: integers are `int` (as Kubernetes' CEL has them), `null` fields are absent.
fn to_cel(v: &Value) -> Cel {
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Cel::Int(i),
            (None, Some(u)) => Cel::UInt(u),
            _ => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(items) => Cel::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(fields) => Cel::Map(CelMap {
            map: Arc::new(
                fields
                    .iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (CelKey::String(Arc::new(k.clone())), to_cel(v)))
                    .collect(),
            ),
        }),
    }
}

/// Names an expression may use without binding them: the object, CEL's type names and the namespaces of the
/// extensions' functions (`math.greatest`).
const KNOWN_NAMES: &[&str] = &[
    "self",
    "object",
    "bool",
    "bytes",
    "double",
    "dyn",
    "int",
    "list",
    "map",
    "null_type",
    "string",
    "type",
    "uint",
    "math",
    "strings",
    "lists",
    "optional",
    "cel",
];

/// The first name the expression reads that is neither known nor bound by a comprehension around it.
fn unknown_name(e: &IdedExpr, bound: &mut Vec<String>) -> Option<String> {
    match &e.expr {
        Expr::Ident(name) => {
            (!KNOWN_NAMES.contains(&name.as_str()) && !bound.contains(name)).then(|| name.clone())
        }
        Expr::Select(s) => unknown_name(&s.operand, bound),
        Expr::Call(c) => c
            .target
            .as_deref()
            .and_then(|t| unknown_name(t, bound))
            .or_else(|| c.args.iter().find_map(|a| unknown_name(a, bound))),
        Expr::List(l) => l.elements.iter().find_map(|a| unknown_name(a, bound)),
        Expr::Map(m) => m.entries.iter().find_map(|entry| match &entry.expr {
            EntryExpr::MapEntry(m) => {
                unknown_name(&m.key, bound).or_else(|| unknown_name(&m.value, bound))
            }
            EntryExpr::StructField(f) => unknown_name(&f.value, bound),
        }),
        Expr::Struct(s) => s.entries.iter().find_map(|entry| match &entry.expr {
            EntryExpr::MapEntry(m) => {
                unknown_name(&m.key, bound).or_else(|| unknown_name(&m.value, bound))
            }
            EntryExpr::StructField(f) => unknown_name(&f.value, bound),
        }),
        Expr::Comprehension(c) => {
            if let Some(n) =
                unknown_name(&c.iter_range, bound).or_else(|| unknown_name(&c.accu_init, bound))
            {
                return Some(n);
            }
            let before = bound.len();
            bound.push(c.iter_var.clone());
            bound.extend(c.iter_var2.clone());
            bound.push(c.accu_var.clone());
            let found = [&c.loop_cond, &c.loop_step, &c.result]
                .into_iter()
                .find_map(|e| unknown_name(e, bound));
            bound.truncate(before);
            found
        }
        Expr::Literal(_) | Expr::Unspecified => None,
    }
}

// The shipped rules. Conditions are read with `has()` on every field that may be absent; a condition's
// `observedGeneration`, when it has one, must be the object's generation (a condition about the previous spec
// says nothing about the one just applied).

/// `has(self.status) && has(self.status.conditions)`.
const HAS_CONDITIONS: &str = "has(self.status) && has(self.status.conditions)";

/// Flux (and kstatus): the controller has seen this generation.
const FLUX_OBSERVED: &str = "has(self.status) && has(self.status.observedGeneration) \
    && self.status.observedGeneration == self.metadata.generation";

/// A Flux object (every toolkit kind follows kstatus): healthy when `Ready` is `True` for this generation,
/// failed when `Stalled` is `True` for it (the controller gave up: remediation retries exhausted, an invalid
/// spec). Argo CD's HelmRelease script calls a `Ready=False` release Degraded as soon as it is not also
/// `Reconciling`; here a release that Flux is still retrying is progressing, as kstatus and `flux` have it
/// (<https://fluxcd.io/flux/components/helm/helmreleases/#conditions>).
fn flux(kind: &str) -> HealthRule {
    HealthRule::new(
        kind,
        format!(
            "{FLUX_OBSERVED} && has(self.status.conditions) \
             && self.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')"
        ),
    )
    .failed(format!(
        "{FLUX_OBSERVED} && has(self.status.conditions) \
         && self.status.conditions.exists(c, c.type == 'Stalled' && c.status == 'True')"
    ))
    .message(format!(
        "has(self.spec) && has(self.spec.suspend) && self.spec.suspend \
           ? 'suspended (spec.suspend): the controller does not reconcile it' \
         : !({FLUX_OBSERVED}) \
           ? 'waiting for the controller to observe generation ' + string(self.metadata.generation) \
         : has(self.status.conditions) && self.status.conditions.exists(c, \
             c.type == 'Stalled' && c.status == 'True' && has(c.message)) \
           ? 'stalled: ' + self.status.conditions.filter(c, c.type == 'Stalled' && c.status == 'True')[0].message \
         : has(self.status.conditions) && self.status.conditions.exists(c, c.type == 'Ready' && has(c.message)) \
           ? self.status.conditions.filter(c, c.type == 'Ready' && has(c.message))[0].message \
         : 'waiting for the Ready condition'"
    ))
}

/// The rules shipped with the role, as a hub config would write them. [`Rules::load`] puts the configured
/// ones on top.
pub fn shipped_rules() -> Vec<HealthRule> {
    vec![
        // cert-manager: healthy when Ready is True for this generation and no issuance is under way (Argo
        // CD's cert-manager.io/Certificate script). Failed when the last issuance for this generation failed
        // (`Issuing` False, reason `Failed`: cert-manager backs off for an hour and more). Argo CD also calls
        // `Ready=False` Degraded; not here: cert-manager's readiness controller writes `Ready=False` on every
        // new certificate before its trigger controller writes `Issuing=True`.
        HealthRule::new(
            "cert-manager.io/Certificate",
            format!(
                "{HAS_CONDITIONS} \
                 && !self.status.conditions.exists(c, c.type == 'Issuing' && c.status == 'True') \
                 && self.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True' \
                      && (!has(c.observedGeneration) || c.observedGeneration == self.metadata.generation))"
            ),
        )
        .failed(format!(
            "{HAS_CONDITIONS} \
             && self.status.conditions.exists(c, c.type == 'Issuing' && c.status == 'False' \
                  && has(c.reason) && c.reason == 'Failed' \
                  && (!has(c.observedGeneration) || c.observedGeneration == self.metadata.generation))"
        ))
        .message(format!(
            "!({HAS_CONDITIONS}) ? 'waiting for cert-manager to report' \
             : self.status.conditions.exists(c, c.type == 'Issuing' && c.status == 'True' && has(c.message)) \
               ? self.status.conditions.filter(c, c.type == 'Issuing' && c.status == 'True' \
                   && has(c.message))[0].message \
             : self.status.conditions.exists(c, c.type in ['Ready', 'Issuing'] && has(c.observedGeneration) \
                 && c.observedGeneration != self.metadata.generation) \
               ? 'waiting for cert-manager to observe generation ' + string(self.metadata.generation) \
             : self.status.conditions.exists(c, c.type == 'Issuing' && has(c.reason) && c.reason == 'Failed' \
                 && has(c.message)) \
               ? self.status.conditions.filter(c, c.type == 'Issuing' && has(c.reason) \
                   && c.reason == 'Failed' && has(c.message))[0].message \
             : self.status.conditions.exists(c, c.type == 'Ready' && has(c.message)) \
               ? self.status.conditions.filter(c, c.type == 'Ready' && has(c.message))[0].message \
             : 'waiting for the Ready condition'"
        )),
        // Argo Rollouts (v1.0 and later write status.phase: Healthy, Progressing, Paused, Degraded, and a
        // message), as Argo CD's argoproj.io/Rollout script reads it: only once the controller has seen this
        // generation (`status.observedGeneration` is the generation as a string; before v0.10 it was a hash,
        // which is taken as seen) and, for a rollout of a `workloadRef`, the workload's generation.
        // A paused rollout (waiting for a promotion) is progressing: the gate waits for it.
        {
            let observed = "has(self.status) && has(self.status.observedGeneration) \
                && (!string(self.status.observedGeneration).matches('^[0-9]+$') \
                    || int(string(self.status.observedGeneration)) >= self.metadata.generation) \
                && (!has(self.spec.workloadRef) || !has(self.metadata.annotations) \
                    || !('rollout.argoproj.io/workload-generation' in self.metadata.annotations) \
                    || (has(self.status.workloadObservedGeneration) \
                        && string(self.status.workloadObservedGeneration) \
                           == self.metadata.annotations['rollout.argoproj.io/workload-generation']))";
            HealthRule::new(
                "argoproj.io/Rollout",
                format!("{observed} && has(self.status.phase) && self.status.phase == 'Healthy'"),
            )
            .failed(format!(
                "{observed} && has(self.status.phase) && self.status.phase == 'Degraded'"
            ))
            .message(format!(
                "!({observed}) ? 'waiting for the rollout controller to observe the spec' \
                 : !has(self.status.phase) ? 'no status.phase (Argo Rollouts before v1.0 writes none)' \
                 : has(self.status.message) && self.status.message != '' \
                   ? self.status.phase + ': ' + self.status.message \
                 : self.status.phase"
            ))
        },
        flux("helm.toolkit.fluxcd.io/HelmRelease"),
        flux("kustomize.toolkit.fluxcd.io/Kustomization"),
        flux("source.toolkit.fluxcd.io/GitRepository"),
        flux("source.toolkit.fluxcd.io/OCIRepository"),
        // CloudNativePG: the phase, as Argo CD's postgresql.cnpg.io/Cluster script maps it. Healthy in
        // "Cluster in healthy state" (with its Ready condition, when there is one, True and current). Failed in
        // the phases that wait for a person (Argo CD: Suspended, and "Waiting for user action"); the others it
        // calls Degraded (a failover, a switchover, an upgrade, applying configuration) pass by themselves and
        // are progressing here. CloudNativePG writes no observed generation: right after an apply the phase may
        // still be the previous spec's healthy one, which the soak after the gate covers.
        HealthRule::new(
            "postgresql.cnpg.io/Cluster",
            "has(self.status) && has(self.status.phase) && self.status.phase == 'Cluster in healthy state' \
             && (!has(self.status.observedGeneration) \
                 || self.status.observedGeneration == self.metadata.generation) \
             && (!has(self.status.conditions) || !self.status.conditions.exists(c, c.type == 'Ready' \
                 && (c.status != 'True' \
                     || (has(c.observedGeneration) && c.observedGeneration != self.metadata.generation))))",
        )
        .failed(
            "has(self.status) && has(self.status.phase) && self.status.phase in [\
               'Unable to create required cluster objects', \
               'Cluster cannot proceed to reconciliation due to an unknown plugin being required', \
               'Cluster has incomplete or invalid image catalog', \
               'Cluster is unrecoverable and needs manual intervention', \
               'Cluster cannot execute instance online upgrade due to missing architecture binary', \
               'Waiting for user action']",
        )
        .message(
            "!has(self.status) || !has(self.status.phase) ? 'no status.phase yet' \
             : has(self.status.phaseReason) && self.status.phaseReason != '' \
               ? self.status.phase + ': ' + self.status.phaseReason \
             : has(self.status.conditions) && self.status.conditions.exists(c, c.type == 'Ready' \
                 && c.status != 'True') \
               ? self.status.phase + ', but Ready is ' + self.status.conditions.filter(c, \
                   c.type == 'Ready')[0].status \
             : self.status.phase",
        ),
        // Crossplane managed resources of Upbound's providers (Argo CD's *.upbound.io/* script, from
        // Crossplane's Argo CD guide): healthy when Ready and Synced are True (Synced for this generation);
        // their ProviderConfigs and usages have no status and are healthy. No `failed`: Crossplane retries
        // every error, and a first reconcile reports `Synced=False` until a resource it references exists;
        // Argo CD calls that Degraded, here it is progressing with the condition's message and the gate's
        // timeout decides.
        HealthRule::new(
            "*.upbound.io/*",
            format!(
                "self.kind in ['ProviderConfig', 'ClusterProviderConfig', 'ProviderConfigUsage', \
                               'ClusterProviderConfigUsage'] \
                 || ({HAS_CONDITIONS} \
                     && self.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True') \
                     && self.status.conditions.exists(c, c.type == 'Synced' && c.status == 'True' \
                          && (!has(c.observedGeneration) || c.observedGeneration == self.metadata.generation)))"
            ),
        )
        .message(format!(
            "!({HAS_CONDITIONS}) ? 'waiting for the provider to report' \
             : self.status.conditions.exists(c, c.type in ['Synced', 'LastAsyncOperation'] \
                 && c.status == 'False' && has(c.message)) \
               ? self.status.conditions.filter(c, c.type in ['Synced', 'LastAsyncOperation'] \
                   && c.status == 'False' && has(c.message))[0].message \
             : self.status.conditions.exists(c, c.type == 'Ready' && c.status != 'True') \
               ? 'not ready: ' + self.status.conditions.filter(c, c.type == 'Ready')[0].reason \
             : 'waiting for Ready and Synced'"
        )),
        // Job (gitops-engine's health_job.go): healthy once Complete, failed once Failed. Kubernetes 1.31 and
        // later first write SuccessCriteriaMet and FailureTarget, which end the same way.
        HealthRule::new(
            "batch/Job",
            format!(
                "{HAS_CONDITIONS} && self.status.conditions.exists(c, \
                   c.type in ['Complete', 'SuccessCriteriaMet'] && c.status == 'True')"
            ),
        )
        .failed(format!(
            "{HAS_CONDITIONS} && self.status.conditions.exists(c, \
               c.type in ['Failed', 'FailureTarget'] && c.status == 'True')"
        ))
        .message(format!(
            "{HAS_CONDITIONS} && self.status.conditions.exists(c, \
               c.type in ['Failed', 'FailureTarget'] && c.status == 'True') \
               ? (self.status.conditions.filter(c, c.type in ['Failed', 'FailureTarget'] && c.status == 'True') \
                   .map(c, (has(c.reason) ? c.reason : c.type) + (has(c.message) ? ': ' + c.message : '')))[0] \
             : has(self.spec) && has(self.spec.suspend) && self.spec.suspend ? 'suspended (spec.suspend)' \
             : string(has(self.status) && has(self.status.succeeded) ? self.status.succeeded : 0) + '/' \
               + string(has(self.spec) && has(self.spec.completions) ? self.spec.completions : 1) \
               + ' succeeded, ' \
               + string(has(self.status) && has(self.status.active) ? self.status.active : 0) + ' active'"
        )),
        // PersistentVolumeClaim (gitops-engine's health_pvc.go): Bound is healthy, Lost failed, Pending
        // progressing — also when its class binds on first use and no pod of the release uses it yet, which
        // the gate then waits out (replace the rule to accept Pending).
        HealthRule::new(
            "PersistentVolumeClaim",
            "has(self.status) && has(self.status.phase) && self.status.phase == 'Bound'",
        )
        .failed("has(self.status) && has(self.status.phase) && self.status.phase == 'Lost'")
        .message(
            "has(self.status) && has(self.status.phase) ? 'phase ' + self.status.phase \
             : 'no status.phase yet'",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn judge(rules: &Rules, obj: Value) -> Health {
        rules.judge(&obj)
    }

    fn fixtures() -> Vec<(String, Value)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/health");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("tests/data/health")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        let mut out = Vec::new();
        for path in files {
            let text = std::fs::read_to_string(&path).expect("fixture");
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let obj = Value::deserialize(doc).expect("yaml");
                let name = format!(
                    "{}: {} {}",
                    path.file_name().unwrap_or_default().to_string_lossy(),
                    obj["kind"].as_str().unwrap_or_default(),
                    obj["metadata"]["name"].as_str().unwrap_or_default()
                );
                out.push((name, obj));
            }
        }
        out
    }

    #[test]
    fn every_fixture_gets_the_verdict_it_is_annotated_with() {
        let rules = Rules::shipped();
        let fixtures = fixtures();
        assert!(fixtures.len() >= 30, "{} fixtures", fixtures.len());
        // which verdicts each shipped rule was seen to give
        let mut seen: BTreeMap<String, std::collections::BTreeSet<&'static str>> = BTreeMap::new();
        for (name, obj) in &fixtures {
            let notes = &obj["metadata"]["annotations"];
            let want = notes["multipilot.test/health"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no multipilot.test/health"));
            let got = rules.judge(obj);
            assert_eq!(got.name(), want, "{name}: {got:?}");
            if let Some(part) = notes["multipilot.test/reason"].as_str() {
                match &got {
                    Health::Progressing(r) | Health::Failed(r) => {
                        assert!(r.contains(part), "{name}: reason {r:?} lacks {part:?}")
                    }
                    other => panic!("{name}: {other:?} has no reason, wanted {part:?}"),
                }
            }
            if let Health::Progressing(r) = &got {
                // a shipped rule explains itself rather than failing to evaluate
                assert!(!r.contains(" rule: "), "{name}: evaluation error {r:?}");
            }
            let rule = rules
                .rule_for(
                    obj["apiVersion"].as_str().unwrap_or_default(),
                    obj["kind"].as_str().unwrap_or_default(),
                )
                .unwrap_or_else(|| panic!("{name}: no rule"));
            seen.entry(rule.kind.clone())
                .or_default()
                .insert(got.name());
        }
        for rule in shipped_rules() {
            let verdicts = seen.get(&rule.kind).cloned().unwrap_or_default();
            let mut want = vec!["healthy", "progressing"];
            if rule.failed.is_some() {
                want.push("failed");
            }
            for w in want {
                // the Flux source kinds share the toolkit rule tested on HelmRelease and Kustomization
                if rule.kind.starts_with("source.toolkit.fluxcd.io/") && w != "healthy" {
                    continue;
                }
                assert!(verdicts.contains(w), "{}: no {w} fixture", rule.kind);
            }
        }
    }

    #[test]
    fn shipped_rules_compile_and_are_each_for_another_kind() {
        let rules = Rules::shipped();
        assert_eq!(rules.kinds().len(), shipped_rules().len());
        assert!(rules.knows("cert-manager.io/v1", "Certificate"));
        assert!(rules.knows("helm.toolkit.fluxcd.io/v2beta2", "HelmRelease"));
        assert!(rules.knows("batch/v1", "Job"));
        assert!(rules.knows("v1", "PersistentVolumeClaim"));
        assert!(rules.knows("ec2.aws.upbound.io/v1beta1", "VPC"));
        // the built-in rollout checks stay in the machine
        assert!(!rules.knows("apps/v1", "Deployment"));
        fn shared<T: Send + Sync>() {}
        shared::<Rules>();
    }

    #[test]
    fn unknown_kinds_have_no_health() {
        let rules = Rules::shipped();
        for obj in [
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}),
            // same kind, another group
            json!({"apiVersion": "example.com/v1", "kind": "Certificate", "metadata": {"name": "x"}}),
            json!({"apiVersion": "v1", "metadata": {"name": "no kind"}}),
            json!("not an object"),
        ] {
            assert_eq!(judge(&rules, obj.clone()), Health::Unknown, "{obj}");
        }
        assert!(!rules.knows("v1", "ConfigMap"));
        assert_eq!(
            Health::Unknown.to_string(),
            "no health (no rule for its kind)"
        );
        assert_eq!(Health::Failed("x".into()).to_string(), "failed: x");
    }

    #[test]
    fn a_rule_that_does_not_compile_is_refused_with_its_kind() {
        let rule = HealthRule::new("example.com/Widget", "has(self.status").message("'x'");
        let e = Rules::load(&[rule]).expect_err("refused");
        assert!(
            matches!(
                e,
                Error::Compile {
                    field: "healthy",
                    ..
                }
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(text.contains("example.com/Widget"), "{text}");
        assert!(text.contains("healthy does not compile"), "{text}");
        assert!(!e.is_retryable());

        let rule = HealthRule::new("example.com/Widget", "true").failed("self.status.phase ==");
        let e = Rules::load(&[rule]).expect_err("refused");
        assert!(
            e.to_string()
                .contains("example.com/Widget: failed does not compile"),
            "{e}"
        );
    }

    #[test]
    fn a_rule_naming_another_variable_than_self_is_refused() {
        // Argo CD's Lua scripts call the object `obj`
        let rule = HealthRule::new("example.com/Widget", "obj.status.ready == true");
        let e = Rules::load(&[rule]).expect_err("refused");
        let text = e.to_string();
        assert!(text.contains("example.com/Widget"), "{text}");
        assert!(text.contains("\"obj\""), "{text}");
        // a comprehension's own variable, `object`, type names and extension namespaces are fine
        let ok = HealthRule::new(
            "example.com/Widget",
            "object.spec.items.all(i, type(i) == string) && math.greatest([1, 2]) == 2 \
             && self.spec.items.exists(x, x.startsWith('a'))",
        );
        let rules = Rules::load(&[ok]).expect("compiles");
        let w = json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"items": ["ab", "c"]}});
        assert_eq!(judge(&rules, w), Health::Healthy);
        // a variable used outside the comprehension that bound it
        let outside = HealthRule::new("example.com/Widget", "self.spec.items.exists(x, true) && x");
        assert!(matches!(
            Rules::load(&[outside]),
            Err(Error::UnknownName { name, .. }) if name == "x"
        ));
    }

    #[test]
    fn kinds_must_be_group_slash_kind() {
        for (kind, part) in [
            ("cert-manager.io/v1/Certificate", "more than one"),
            ("cert-manager.io/certificates", "CamelCase"),
            ("Cert-Manager.io/Certificate", "lower-case"),
            ("upbound.io*/Bucket", "lower-case"),
            ("*upbound.io/Bucket", "*.suffix"),
            ("cert-manager.io/", "no kind"),
            ("*", "core kind"),
        ] {
            let e = Rules::load(&[HealthRule::new(kind, "true")]).expect_err(kind);
            assert!(e.to_string().contains(part), "{kind}: {e}");
            assert!(e.to_string().contains(kind), "{kind}: {e}");
        }
        // core kinds with or without the slash are the same kind
        let rules = Rules::compile([HealthRule::new("/ConfigMap", "true")]).expect("core");
        assert!(rules.knows("v1", "ConfigMap"));
        assert_eq!(rules.kinds(), vec!["ConfigMap".to_string()]);
        let twice = [
            HealthRule::new("ConfigMap", "true"),
            HealthRule::new("/ConfigMap", "false"),
        ];
        assert!(
            matches!(Rules::load(&twice), Err(Error::Duplicate { kind }) if kind == "ConfigMap")
        );
    }

    #[test]
    fn an_operator_rule_replaces_the_shipped_one_for_its_kind() {
        let pending = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "cache"}, "status": {"phase": "Pending"}});
        assert!(matches!(
            judge(&Rules::shipped(), pending.clone()),
            Health::Progressing(_)
        ));
        let accept_pending = HealthRule::new(
            "PersistentVolumeClaim",
            "has(self.status) && has(self.status.phase) && self.status.phase in ['Bound', 'Pending']",
        );
        let rules = Rules::load(std::slice::from_ref(&accept_pending)).expect("loads");
        assert_eq!(judge(&rules, pending), Health::Healthy);
        assert_eq!(
            rules.rule_for("v1", "PersistentVolumeClaim"),
            Some(&accept_pending)
        );
        // the other shipped rules stay
        assert_eq!(rules.kinds(), Rules::shipped().kinds());
        // a rule that only says `true` turns waiting off for a kind
        let off = Rules::load(&[HealthRule::new("batch/Job", "true")]).expect("loads");
        let running = json!({"apiVersion": "batch/v1", "kind": "Job", "status": {"active": 1}});
        assert_eq!(judge(&off, running), Health::Healthy);
    }

    #[test]
    fn an_evaluation_error_is_progressing_with_the_error() {
        let rules =
            Rules::load(&[
                HealthRule::new("example.com/Widget", "self.status.phase == 'Ready'")
                    .message("self.status.detail"),
            ])
            .expect("loads");
        let bare =
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
        match judge(&rules, bare) {
            Health::Progressing(r) => {
                assert!(r.starts_with("healthy rule: "), "{r}");
                assert!(r.contains("status"), "{r}");
            }
            other => panic!("{other:?}"),
        }
        // a weird object: status is a list
        let weird = json!({"apiVersion": "example.com/v1", "kind": "Widget", "status": [1, 2]});
        assert!(
            matches!(judge(&rules, weird), Health::Progressing(r) if r.starts_with("healthy rule: "))
        );
        // a value of another type
        let rules =
            Rules::load(&[HealthRule::new("example.com/Widget", "self.status.phase")
                .failed("self.status.count")])
            .expect("loads");
        let w = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "status": {"phase": "Ready", "count": 3}});
        assert_eq!(
            judge(&rules, w),
            Health::Progressing("failed rule: gave int, not a bool".into())
        );
        // an unknown function shows when evaluated
        let rules =
            Rules::load(&[HealthRule::new("example.com/Widget", "nosuch(self)")]).expect("loads");
        let w = json!({"apiVersion": "example.com/v1", "kind": "Widget"});
        assert!(matches!(judge(&rules, w), Health::Progressing(r) if r.contains("nosuch")));
    }

    #[test]
    fn a_message_that_fails_or_is_not_a_string_gives_the_default_reason() {
        let rules = Rules::load(&[HealthRule::new("example.com/Widget", "false")
            .failed("has(self.broken)")
            .message("self.status.detail")])
        .expect("loads");
        let w = json!({"apiVersion": "example.com/v1", "kind": "Widget"});
        assert_eq!(
            judge(&rules, w),
            Health::Progressing("not healthy yet".into())
        );
        let w = json!({"apiVersion": "example.com/v1", "kind": "Widget", "broken": true,
            "status": {"detail": 7}});
        assert_eq!(
            judge(&rules, w),
            Health::Failed("its failed rule holds".into())
        );
    }

    #[test]
    fn failed_is_asked_before_healthy() {
        let rules = Rules::load(&[HealthRule::new("example.com/Widget", "true")
            .failed("self.status.broken")
            .message("'broken: ' + self.status.why")])
        .expect("loads");
        let w = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "status": {"broken": true, "why": "disk\n   full"}});
        assert_eq!(judge(&rules, w), Health::Failed("broken: disk full".into()));
    }

    #[test]
    fn long_reasons_are_cut() {
        let rules = Rules::load(&[
            HealthRule::new("example.com/Widget", "false").message("self.status.detail")
        ])
        .expect("loads");
        let w = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "status": {"detail": "é".repeat(2000)}});
        let Health::Progressing(r) = judge(&rules, w) else {
            panic!("progressing")
        };
        assert_eq!(r.chars().count(), MAX_REASON + 1);
        assert!(r.ends_with('…'));
    }

    #[test]
    fn the_object_is_self_and_object_and_nulls_are_absent() {
        let rules = Rules::load(&[HealthRule::new(
            "example.com/Widget",
            "!has(self.status.detail) && object.status.n == 3 && self.status.big > 9223372036854775807u",
        )])
        .expect("loads");
        let w = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "status": {"detail": null, "n": 3, "big": 18446744073709551615u64}});
        assert_eq!(judge(&rules, w), Health::Healthy);
    }

    #[test]
    fn the_most_specific_rule_judges() {
        let rules = Rules::compile([
            HealthRule::new("*.example.com/*", "false").message("'any kind of any group'"),
            HealthRule::new("*.db.example.com/*", "false").message("'any kind of a db group'"),
            HealthRule::new("*.example.com/Widget", "false").message("'widgets of any group'"),
            HealthRule::new("pg.db.example.com/*", "false").message("'anything of pg'"),
            HealthRule::new("pg.db.example.com/Widget", "false").message("'pg widgets'"),
        ])
        .expect("compiles");
        let reason =
            |api: &str, kind: &str| match rules.judge(&json!({"apiVersion": api, "kind": kind})) {
                Health::Progressing(r) => r,
                other => panic!("{other:?}"),
            };
        assert_eq!(reason("pg.db.example.com/v1", "Widget"), "pg widgets");
        assert_eq!(reason("pg.db.example.com/v1", "Gadget"), "anything of pg");
        assert_eq!(
            reason("my.db.example.com/v1", "Gadget"),
            "any kind of a db group"
        );
        assert_eq!(
            reason("my.db.example.com/v1", "Widget"),
            "any kind of a db group"
        );
        assert_eq!(
            reason("web.example.com/v1", "Widget"),
            "widgets of any group"
        );
        assert_eq!(
            reason("web.example.com/v1", "Gadget"),
            "any kind of any group"
        );
        assert!(
            !rules.knows("example.com/v1", "Widget"),
            "*.example.com needs a subdomain"
        );
        assert!(!rules.knows("example.org/v1", "Widget"));
    }

    #[test]
    fn the_documented_hub_config_loads() {
        // the example in the module's documentation
        let yaml = r#"
health_rules:
  # a kind of their own
  - kind: databases.example.com/Database
    healthy: has(self.status) && has(self.status.state) && self.status.state == 'Available'
    failed: has(self.status) && has(self.status.state) && self.status.state == 'Error'
    message: "has(self.status) && has(self.status.detail) ? self.status.detail : 'no status yet'"
  # replaces the shipped rule: a claim whose class binds on first use is fine while Pending
  - kind: PersistentVolumeClaim
    healthy: has(self.status) && has(self.status.phase) && self.status.phase in ['Bound', 'Pending']
"#;
        let config: crate::Config = serde_yaml::from_str(yaml).expect("config");
        assert_eq!(config.health_rules.len(), 2);
        config.validate().expect("valid");
        let rules = Rules::load(&config.health_rules).expect("loads");
        let db = json!({"apiVersion": "databases.example.com/v1", "kind": "Database",
            "status": {"state": "Creating", "detail": "allocating storage"}});
        assert_eq!(
            judge(&rules, db),
            Health::Progressing("allocating storage".into())
        );
        let db = json!({"apiVersion": "databases.example.com/v1", "kind": "Database",
            "status": {"state": "Error"}});
        assert_eq!(judge(&rules, db), Health::Failed("no status yet".into()));
        // unknown keys in a rule are refused
        let bad = "health_rules:\n  - kind: x.io/Y\n    healthy: 'true'\n    ready: 'true'\n";
        assert!(serde_yaml::from_str::<crate::Config>(bad).is_err());
    }
}
