//! Queries over a partitioned TSDB: each instance stores the clusters of its partition, and any instance
//! answers for the whole fleet by reading what a query needs from its peers.
//!
//! A peer serves `POST /internal/v1/select` (the series matching some matcher sets, with their samples in
//! a time range) and `POST /internal/v1/labels` (label names or one label's values) from its local store
//! only, so a query never recurses. Bodies are MessagePack (`application/msgpack`): sample values keep
//! every bit, stale markers (a NaN payload) included, which JSON could not carry. An instance with
//! `peers` evaluates a PromQL query over the local and remote series merged in memory
//! ([`crate::promql::Gathered`]); a peer that does not answer fails the query with an error naming it,
//! never a silently partial result.

use std::sync::Arc;
use std::time::Duration;

use promql_parser::label::Matcher;
use promql_parser::parser::token::{T_EQL, T_EQL_REGEX, T_NEQ, T_NEQ_REGEX};
use serde::{Deserialize, Serialize};

use crate::promql::{Gathered, Plan};
use crate::store::{Labels, Store};

/// Path of the select endpoint.
pub const SELECT_PATH: &str = "/internal/v1/select";
/// Path of the labels endpoint.
pub const LABELS_PATH: &str = "/internal/v1/labels";
/// Content type of the internal endpoints.
pub const CONTENT_TYPE: &str = "application/msgpack";

/// Federation failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A peer did not answer or answered something unusable (retryable: the query can be asked again).
    #[error(
        "peer {url} did not answer ({reason}); the clusters of its partition cannot be read, so the result would be partial"
    )]
    Peer {
        /// The peer's base URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// A request to the internal endpoint is malformed (the caller's fault).
    #[error("bad internal request: {0}")]
    BadRequest(String),
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A label matcher on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireMatcher {
    /// Label name.
    pub name: String,
    /// `=`, `!=`, `=~` or `!~`.
    pub op: String,
    /// Value or regular expression (as written in the query, unanchored).
    pub value: String,
}

impl From<&Matcher> for WireMatcher {
    fn from(m: &Matcher) -> Self {
        WireMatcher {
            name: m.name.clone(),
            op: m.op.to_string(),
            value: m.value.clone(),
        }
    }
}

impl WireMatcher {
    /// The matcher (regular expressions are anchored and compiled as the query parser does).
    pub fn to_matcher(&self) -> Result<Matcher> {
        let id = match self.op.as_str() {
            "=" => T_EQL,
            "!=" => T_NEQ,
            "=~" => T_EQL_REGEX,
            "!~" => T_NEQ_REGEX,
            other => {
                return Err(Error::BadRequest(format!(
                    "unknown matcher operator {other:?}"
                )));
            }
        };
        let m = std::panic::catch_unwind(|| {
            Matcher::new_matcher(id, self.name.clone(), self.value.clone())
        })
        .map_err(|_| Error::BadRequest(format!("invalid matcher {:?}", self.value)))?
        .map_err(Error::BadRequest)?;
        Ok(m)
    }
}

fn to_wire(sets: &[Vec<Matcher>]) -> Vec<Vec<WireMatcher>> {
    sets.iter()
        .map(|set| set.iter().map(WireMatcher::from).collect())
        .collect()
}

/// Decodes wire matcher sets.
pub fn from_wire(sets: &[Vec<WireMatcher>]) -> Result<Vec<Vec<Matcher>>> {
    sets.iter()
        .map(|set| set.iter().map(WireMatcher::to_matcher).collect())
        .collect()
}

/// `POST /internal/v1/select`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectRequest {
    /// Matcher sets: a series matching any set is returned.
    pub matchers: Vec<Vec<WireMatcher>>,
    /// Earliest sample time (ms, inclusive).
    pub mint: i64,
    /// Latest sample time (ms, inclusive).
    pub maxt: i64,
    /// Whether to send the samples (false: labels only). Either way only series with a sample in
    /// `[mint, maxt]` are returned, unless the range is unbounded (`i64::MIN..=i64::MAX`).
    pub samples: bool,
}

/// One series in a [`SelectRequest`]'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireSeries {
    /// Labels, sorted by name.
    pub labels: Labels,
    /// Samples sorted by time (empty when not asked for).
    pub samples: Vec<(i64, f64)>,
}

/// `POST /internal/v1/labels`: label names (`name` absent) or the values of label `name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelsRequest {
    /// The label whose values are asked for.
    pub name: Option<String>,
    /// Only of series matching any of these sets (all series when empty).
    pub matchers: Vec<Vec<WireMatcher>>,
}

/// Answers a select request from the local store (blocking).
pub fn answer_select(store: &Store, req: &SelectRequest) -> Result<Vec<WireSeries>> {
    let sets = from_wire(&req.matchers)?;
    if req.mint > req.maxt {
        return Err(Error::BadRequest("mint after maxt".into()));
    }
    let bounded = req.mint != i64::MIN || req.maxt != i64::MAX;
    let mut out = Vec::new();
    for (id, labels) in store.select(&sets) {
        let samples = if req.samples || bounded {
            store
                .samples(id, req.mint, req.maxt)
                .map_err(|e| Error::BadRequest(format!("reading the store: {e}")))?
        } else {
            Vec::new()
        };
        if bounded && samples.is_empty() {
            continue;
        }
        out.push(WireSeries {
            labels: (*labels).clone(),
            samples: if req.samples { samples } else { Vec::new() },
        });
    }
    Ok(out)
}

/// Answers a labels request from the local store (blocking).
pub fn answer_labels(store: &Store, req: &LabelsRequest) -> Result<Vec<String>> {
    let sets = from_wire(&req.matchers)?;
    Ok(match &req.name {
        None => store.label_names(&sets),
        Some(n) => store.label_values(n, &sets),
    })
}

/// The other partitions' instances.
#[derive(Debug, Clone)]
pub struct Peers {
    client: reqwest::Client,
    urls: Arc<Vec<String>>,
}

impl Peers {
    /// Peers at `urls` (base URLs), each asked with `timeout`.
    pub fn new(urls: &[String], timeout: Duration, token: Option<&str>) -> Result<Self> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(t) = token {
            let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {t}"))
                .map_err(|e| Error::BadRequest(format!("peer_token: {e}")))?;
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .default_headers(headers)
            .build()
            .map_err(|e| Error::BadRequest(format!("http client: {e}")))?;
        Ok(Peers {
            client,
            urls: Arc::new(
                urls.iter()
                    .map(|u| u.trim_end_matches('/').to_string())
                    .collect(),
            ),
        })
    }

    /// The peers' base URLs.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    async fn post<Req: Serialize, Resp: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        path: &str,
        req: &Req,
    ) -> Result<Resp> {
        let fail = |reason: String| Error::Peer {
            url: url.to_string(),
            reason,
        };
        let body = rmp_serde::to_vec_named(req).map_err(|e| fail(e.to_string()))?;
        let resp = self
            .client
            .post(format!("{url}{path}"))
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .body(body)
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| fail(e.to_string()))?;
        if !status.is_success() {
            return Err(fail(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            )));
        }
        rmp_serde::from_slice(&bytes).map_err(|e| fail(format!("undecodable answer: {e}")))
    }

    /// Asks every peer at once; the first failure fails the whole.
    async fn all<Req, Resp>(&self, path: &'static str, req: Req) -> Result<Vec<Resp>>
    where
        Req: Serialize + Send + Sync + 'static,
        Resp: serde::de::DeserializeOwned + Send + 'static,
    {
        let req = Arc::new(req);
        let mut tasks = tokio::task::JoinSet::new();
        for (i, url) in self.urls.iter().enumerate() {
            let (me, url, req) = (self.clone(), url.clone(), req.clone());
            tasks.spawn(async move { (i, me.post::<Req, Resp>(&url, path, &*req).await) });
        }
        let mut out: Vec<Option<Resp>> = (0..self.urls.len()).map(|_| None).collect();
        while let Some(done) = tasks.join_next().await {
            let (i, r) = done.map_err(|e| Error::Peer {
                url: "?".into(),
                reason: format!("task failed: {e}"),
            })?;
            out[i] = Some(r?);
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// The series of `req` from every peer.
    pub async fn select(&self, req: SelectRequest) -> Result<Vec<WireSeries>> {
        Ok(self
            .all::<_, Vec<WireSeries>>(SELECT_PATH, req)
            .await?
            .into_iter()
            .flatten()
            .collect())
    }

    /// The label names or values of `req` from every peer, merged with `local` (sorted, unique).
    pub async fn labels(&self, req: LabelsRequest, local: Vec<String>) -> Result<Vec<String>> {
        let mut all = local;
        for part in self.all::<_, Vec<String>>(LABELS_PATH, req).await? {
            all.extend(part);
        }
        all.sort();
        all.dedup();
        Ok(all)
    }

    /// Gathers what `plan` reads from the local store and every peer.
    pub async fn gather(&self, store: Arc<Store>, plan: &Plan) -> Result<Gathered> {
        let req = SelectRequest {
            matchers: to_wire(&plan.matchers),
            mint: plan.mint,
            maxt: plan.maxt,
            samples: true,
        };
        let local_req = req.clone();
        let local = tokio::task::spawn_blocking(move || answer_select(&store, &local_req)).await;
        let local = local.map_err(|e| Error::BadRequest(format!("local select task: {e}")))??;
        let remote = self.select(req).await?;
        Ok(Gathered::new(
            local
                .into_iter()
                .chain(remote)
                .map(|s| (s.labels, s.samples)),
        ))
    }

    /// The labels of the series matching `sets` in `[mint, maxt]` from every peer.
    pub async fn series(&self, sets: &[Vec<Matcher>], mint: i64, maxt: i64) -> Result<Vec<Labels>> {
        let req = SelectRequest {
            matchers: to_wire(sets),
            mint,
            maxt,
            samples: false,
        };
        Ok(self
            .select(req)
            .await?
            .into_iter()
            .map(|s| s.labels)
            .collect())
    }

    /// A labels request for `name` (or names) of series matching `sets`.
    pub fn labels_request(name: Option<String>, sets: &[Vec<Matcher>]) -> LabelsRequest {
        LabelsRequest {
            name,
            matchers: to_wire(sets),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use promql_parser::label::MatchOp;

    #[test]
    fn matchers_round_trip_and_bad_ones_are_errors() {
        let sets = vec![vec![
            Matcher::new(MatchOp::Equal, "__name__", "up"),
            Matcher::new_matcher(T_EQL_REGEX, "cluster".into(), "prod-.*".into()).expect("re"),
            Matcher::new(MatchOp::NotEqual, "job", "x"),
        ]];
        let back = from_wire(&to_wire(&sets)).expect("decodes");
        assert_eq!(back, sets);
        assert!(back[0][1].is_match("prod-1") && !back[0][1].is_match("xprod-1"));
        let bad = |op: &str, value: &str| {
            from_wire(&[vec![WireMatcher {
                name: "a".into(),
                op: op.into(),
                value: value.into(),
            }]])
        };
        assert!(bad("==", "x").is_err());
        assert!(bad("=~", "(").is_err());
    }

    #[test]
    fn stale_markers_survive_the_wire() {
        let s = WireSeries {
            labels: vec![("__name__".into(), "up".into())],
            samples: vec![(1, f64::from_bits(crate::chunk::STALE_NAN_BITS)), (2, 1.5)],
        };
        let bytes = rmp_serde::to_vec_named(&s).expect("encodes");
        let back: WireSeries = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(back.samples[0].1.to_bits(), s.samples[0].1.to_bits());
        assert_eq!(back.samples[1], (2, 1.5));
    }
}
