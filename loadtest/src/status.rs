//! The apiserver's `Status` errors: the exact `reason`/`code` pairs clients branch on.

use serde_json::{Value, json};

/// An error the simulated apiserver answers with a `Status` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `reason` (NotFound, AlreadyExists, Conflict, Expired, Invalid…).
    pub reason: &'static str,
    /// Human message.
    pub message: String,
    /// `details`, when the reason has them.
    pub details: Option<Value>,
}

fn gr(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String, details: Option<Value>) -> Self {
        ApiError {
            code,
            reason,
            message,
            details,
        }
    }

    /// `404 NotFound` for an object.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", gr(group, plural)),
            Some(json!({"name": name, "group": group, "kind": plural})),
        )
    }

    /// `404 NotFound` for a path the server does not serve (unserved group/version/resource).
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
            None,
        )
    }

    /// `409 AlreadyExists`.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", gr(group, plural)),
            Some(json!({"name": name, "group": group, "kind": plural})),
        )
    }

    /// `409 Conflict` on a stale resourceVersion.
    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                gr(group, plural)
            ),
            Some(json!({"name": name, "group": group, "kind": plural})),
        )
    }

    /// `409 Conflict` for a failed precondition, with the apiserver's reason after the colon.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                gr(group, plural)
            ),
            Some(json!({"name": name, "group": group, "kind": plural})),
        )
    }

    /// `409 Conflict` from server-side apply: another manager owns fields whose values change. Each
    /// conflict is (the owner as the apiserver names it, quoted: `"alice"`, field path).
    pub fn apply_conflict(
        group: &str,
        plural: &str,
        name: &str,
        conflicts: &[(String, String)],
    ) -> Self {
        let n = conflicts.len();
        let list = conflicts
            .iter()
            .map(|(m, f)| format!("- conflict with {m}: {f}"))
            .collect::<Vec<_>>()
            .join("\n");
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, f)| {
                json!({"type": "FieldManagerConflict", "message": format!("conflict with {m}"), "field": f})
            })
            .collect();
        Self::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {n} conflict{}: {}",
                if n == 1 { "" } else { "s" },
                if n == 1 {
                    format!("conflict with {}: {}", conflicts[0].0, conflicts[0].1)
                } else {
                    format!("\n{list}")
                }
            ),
            Some(json!({"name": name, "group": group, "kind": plural, "causes": causes})),
        )
    }

    /// `410 Expired`/Gone (resourceVersion too old).
    pub fn expired(message: &str) -> Self {
        Self::new(410, "Expired", message.into(), None)
    }

    /// `400 BadRequest`.
    pub fn bad_request(message: &str) -> Self {
        Self::new(400, "BadRequest", message.into(), None)
    }

    /// `422 Invalid`, with one cause per field.
    pub fn invalid(kind: &str, name: &str, causes: &[(String, String)]) -> Self {
        let msg = causes
            .iter()
            .map(|(f, m)| format!("{f}: {m}"))
            .collect::<Vec<_>>()
            .join(", ");
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {msg}"),
            Some(json!({
                "name": name, "kind": kind,
                "causes": causes.iter().map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f})).collect::<Vec<_>>()
            })),
        )
    }

    /// `422 Invalid` naming the kind with its group, as the apiserver does (`Scale.autoscaling "web" is
    /// invalid: …`).
    pub fn invalid_in(group: &str, kind: &str, name: &str, causes: &[(String, String)]) -> Self {
        let mut e = Self::invalid(&gr(group, kind), name, causes);
        if let Some(d) = e.details.as_mut() {
            d["kind"] = json!(kind);
            d["group"] = json!(group);
        }
        e
    }

    /// `415 UnsupportedMediaType`.
    pub fn unsupported_media(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; got {ct:?}"
            ),
            None,
        )
    }

    /// `405 MethodNotAllowed`.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
            None,
        )
    }

    /// `401 Unauthorized`.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized".into(), None)
    }

    /// `429 TooManyRequests` (apiserver priority and fairness rejecting).
    pub fn too_many_requests() -> Self {
        Self::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.".into(),
            Some(json!({"retryAfterSeconds": 1})),
        )
    }

    /// `503 ServiceUnavailable` (e.g. a proxy with no endpoints).
    pub fn new_service_unavailable(message: &str) -> Self {
        Self::new(503, "ServiceUnavailable", message.into(), None)
    }

    /// `500 InternalError`.
    pub fn internal(message: &str) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
            None,
        )
    }

    /// The `Status` body.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
