//! The cause a role error carries when what failed is a dependency it does not type itself (sled, a NATS
//! call, a kube client): what the role was doing, and the underlying error as its `source`.

/// What was being done when a dependency failed, and the failure.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct Cause {
    /// What was being done (`opening the alerts store in ./data`).
    pub what: String,
    /// The failure.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl Cause {
    /// A cause without an underlying error value (a condition found, not an error returned).
    pub fn msg(what: impl Into<String>, why: impl Into<String>) -> Self {
        Cause {
            what: what.into(),
            source: why.into().into(),
        }
    }
}

/// `map_err(cause("opening the store"))`: wraps an error with what was being done.
pub fn cause<E: std::error::Error + Send + Sync + 'static>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> Cause {
    let what = what.into();
    move |e| Cause {
        what,
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_says_what_and_why_and_keeps_the_source() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let c = cause("opening ./data")(io);
        assert_eq!(c.to_string(), "opening ./data: denied");
        assert!(std::error::Error::source(&c).is_some());
        assert_eq!(
            Cause::msg("reading", "absent").to_string(),
            "reading: absent"
        );
    }
}
