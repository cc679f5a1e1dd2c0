//! The Prometheus HTTP API (the subset Grafana and promtool use): `/api/v1/query`, `/api/v1/query_range`,
//! `/api/v1/series`, `/api/v1/labels`, `/api/v1/label/<name>/values`, `/api/v1/status/buildinfo`, and
//! empty `/api/v1/metadata` and `/api/v1/query_exemplars`. With peers (a partitioned TSDB), queries,
//! series and labels cover every partition ([`crate::federate`]); the peers' internal endpoints
//! (`/internal/v1/select`, `/internal/v1/labels`) answer from the local store only. Parameters come from the query string or a
//! form-encoded POST body, as in Prometheus; responses use its JSON envelope and number formatting.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use promql_parser::label::Matcher;
use promql_parser::parser::Expr;

use crate::federate::{self, Peers};
use crate::promql::{self, Engine, Value};
use crate::store::{Labels, Store};
use multipilot_runtime::auth::Principal;

/// Who asks (the auth middleware puts it in; absent with auth off).
type Asker = Option<Extension<Principal>>;

/// The matcher a principal's queries are narrowed by: `cluster=~"<its clusters>"`, `None` for a principal
/// that sees the whole fleet.
fn scope_of(asker: &Asker) -> Result<Option<Matcher>, ApiError> {
    let Some(re) = asker.as_ref().and_then(|Extension(p)| p.cluster_regex()) else {
        return Ok(None);
    };
    Ok(Some(promql::regex_matcher("cluster", &re)?))
}

/// A query, parsed and narrowed to what the asker may see.
fn parse_scoped(query: &str, scope: &Option<Matcher>) -> Result<Expr, ApiError> {
    let mut expr = promql::parse(query)?;
    if let Some(m) = scope {
        promql::enforce(&mut expr, m);
    }
    Ok(expr)
}

/// A middleware for routes that answer for the whole fleet (the rules and their alerts, a reload): a
/// token that sees only some clusters is refused with 403.
pub async fn whole_fleet_only(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(p) = req.extensions().get::<Principal>()
        && p.scoped()
    {
        return ApiError {
            status: StatusCode::FORBIDDEN,
            kind: "forbidden",
            message: format!(
                "{} sees only some clusters; {} answers for the whole fleet",
                p.subject,
                req.uri().path()
            ),
        }
        .into_response();
    }
    next.run(req).await
}

/// Refuses the peers' internal endpoints to a token that sees only some clusters.
fn refuse_scoped(asker: &Asker) -> Result<(), ApiError> {
    match asker {
        Some(Extension(p)) if p.scoped() => Err(ApiError {
            status: StatusCode::FORBIDDEN,
            kind: "forbidden",
            message: format!(
                "{} sees only some clusters; this endpoint is for the TSDB's peers",
                p.subject
            ),
        }),
        _ => Ok(()),
    }
}

/// Query API settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Lookback delta of instant selectors.
    pub lookback: Duration,
    /// Base URLs of the other partitions' instances (empty: this store is the whole fleet).
    pub peers: Vec<String>,
    /// How long a query waits for a peer.
    pub peer_timeout: Duration,
    /// The bearer token sent to peers.
    pub peer_token: Option<String>,
    /// Required tokens (`None`: open, on loopback only).
    pub tokens: Option<Arc<multipilot_runtime::auth::Tokens>>,
}

impl From<&crate::Config> for Options {
    fn from(c: &crate::Config) -> Self {
        Options {
            lookback: c.lookback_delta,
            peers: c.peers.clone(),
            peer_timeout: c.peer_timeout,
            peer_token: c.peer_token.as_ref().map(|t| t.0.clone()),
            tokens: None,
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options::from(&crate::Config::default())
    }
}

#[derive(Debug, Clone)]
struct App {
    engine: Engine,
    peers: Option<Peers>,
}

/// The API routes over `store` (fails only when the peers' HTTP client cannot be built).
pub fn router(store: Arc<Store>, opts: Options) -> Result<Router, federate::Error> {
    let peers = if opts.peers.is_empty() {
        None
    } else {
        Some(Peers::new(
            &opts.peers,
            opts.peer_timeout,
            opts.peer_token.as_deref(),
        )?)
    };
    let app = App {
        engine: Engine::new(store, opts.lookback),
        peers,
    };
    let router = Router::new()
        .route("/api/v1/query", get(query).post(query))
        .route("/api/v1/query_range", get(query_range).post(query_range))
        .route("/api/v1/series", get(series).post(series))
        .route("/api/v1/labels", get(labels).post(labels))
        .route("/api/v1/label/{name}/values", get(label_values))
        .route("/api/v1/status/buildinfo", get(buildinfo))
        .route("/api/v1/metadata", get(|| async { ok("{}".into()) }))
        .route(
            "/api/v1/query_exemplars",
            get(|| async { ok("[]".into()) }).post(|| async { ok("[]".into()) }),
        )
        .route(federate::SELECT_PATH, post(internal_select))
        .route(federate::LABELS_PATH, post(internal_labels))
        .with_state(app);
    Ok(match opts.tokens {
        Some(tokens) => router.route_layer(axum::middleware::from_fn_with_state(
            tokens,
            multipilot_runtime::auth::viewer,
        )),
        None => router,
    })
}

/// A request failure, answered in Prometheus' error envelope.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "bad_data",
            message: message.into(),
        }
    }

    fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "internal",
            message: message.into(),
        }
    }
}

impl From<promql::Error> for ApiError {
    fn from(e: promql::Error) -> Self {
        match e {
            promql::Error::BadData(m) => ApiError::bad(m),
            promql::Error::Execution(m) => ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                kind: "execution",
                message: m,
            },
            e @ (promql::Error::Storage(_) | promql::Error::Internal(_)) => {
                ApiError::internal(e.to_string())
            }
        }
    }
}

impl From<federate::Error> for ApiError {
    fn from(e: federate::Error) -> Self {
        match e {
            federate::Error::BadRequest(m) => ApiError::bad(m),
            e @ federate::Error::Peer { .. } => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "unavailable",
                message: e.to_string(),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "status": "error",
            "errorType": self.kind,
            "error": self.message,
        });
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    }
}

fn ok(data: String) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        format!(r#"{{"status":"success","data":{data}}}"#),
    )
        .into_response()
}

/// Parameters from the query string and a form body.
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(query: Option<String>, body: &[u8]) -> Result<Self, ApiError> {
        let mut all: Vec<(String, String)> = match query {
            Some(q) => serde_urlencoded::from_str(&q)
                .map_err(|e| ApiError::bad(format!("invalid query string: {e}")))?,
            None => Vec::new(),
        };
        if !body.is_empty() {
            let form: Vec<(String, String)> = serde_urlencoded::from_bytes(body)
                .map_err(|e| ApiError::bad(format!("invalid form body: {e}")))?;
            all.extend(form);
        }
        Ok(Params(all))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn time(&self, name: &str) -> Result<Option<i64>, ApiError> {
        self.get(name).map(|v| parse_time(name, v)).transpose()
    }
}

/// A time as Unix seconds (fractions allowed) or RFC 3339, in ms.
fn parse_time(name: &str, v: &str) -> Result<i64, ApiError> {
    if let Ok(f) = v.parse::<f64>()
        && f.is_finite()
        && f.abs() < 1e14
    {
        return Ok((f * 1000.0).round() as i64);
    }
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.timestamp_millis())
        .map_err(|_| {
            ApiError::bad(format!(
                "invalid parameter {name:?}: cannot parse {v:?} to a valid timestamp"
            ))
        })
}

/// A duration as seconds (fractions allowed) or a Prometheus duration (`30s`, `1m30s`), in ms.
fn parse_step(v: &str) -> Result<i64, ApiError> {
    let positive = || {
        ApiError::bad(
            "zero or negative query resolution step widths are not accepted. Try a positive integer",
        )
    };
    if let Ok(f) = v.parse::<f64>() {
        if f.is_finite() && f > 0.0 && f < 1e12 && f * 1000.0 >= 1.0 {
            return Ok((f * 1000.0).round() as i64);
        }
        return Err(positive());
    }
    // The parser's duration function panics on some malformed input: only hand it the duration grammar.
    if !v.starts_with(|c: char| c.is_ascii_digit()) || !v.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return Err(ApiError::bad(format!(
            "invalid parameter \"step\": cannot parse {v:?} to a valid duration"
        )));
    }
    promql_parser::util::parse_duration(v)
        .map(|d| d.as_millis() as i64)
        .map_err(|_| {
            ApiError::bad(format!(
                "invalid parameter \"step\": cannot parse {v:?} to a valid duration"
            ))
        })
        .and_then(|ms| if ms > 0 { Ok(ms) } else { Err(positive()) })
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Runs blocking store work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("query task failed: {e}")))?
}

/// The engine a query runs on: the local one, or with peers one over the series gathered from every
/// partition.
async fn engine_for(app: &App, expr: &Expr, start: i64, end: i64) -> Result<Engine, ApiError> {
    let Some(peers) = &app.peers else {
        return Ok(app.engine.clone());
    };
    let plan = promql::plan_expr(expr, start, end, app.engine.lookback());
    if plan.matchers.is_empty() {
        return Ok(app.engine.clone());
    }
    let gathered = peers.gather(app.engine.store().clone(), &plan).await?;
    Ok(app
        .engine
        .with_source(promql::Source::Gathered(Arc::new(gathered))))
}

async fn query(
    State(app): State<App>,
    asker: Asker,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    let result = async {
        let p = Params::parse(q, &body)?;
        let query = p
            .get("query")
            .ok_or_else(|| ApiError::bad("invalid parameter \"query\": query is empty"))?;
        let expr = parse_scoped(query, &scope_of(&asker)?)?;
        let t = p.time("time")?.unwrap_or_else(now_ms);
        let engine = engine_for(&app, &expr, t, t).await?;
        let value = blocking(move || Ok(engine.instant_expr(&expr, t)?)).await?;
        Ok::<_, ApiError>(ok(instant_json(&value, t)))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn query_range(
    State(app): State<App>,
    asker: Asker,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    let result = async {
        let p = Params::parse(q, &body)?;
        let query = p
            .get("query")
            .ok_or_else(|| ApiError::bad("invalid parameter \"query\": query is empty"))?;
        let expr = parse_scoped(query, &scope_of(&asker)?)?;
        let start = p
            .time("start")?
            .ok_or_else(|| ApiError::bad("invalid parameter \"start\": missing"))?;
        let end = p
            .time("end")?
            .ok_or_else(|| ApiError::bad("invalid parameter \"end\": missing"))?;
        if end < start {
            return Err(ApiError::bad(
                "invalid parameter \"end\": end timestamp must not be before start time",
            ));
        }
        let step = parse_step(
            p.get("step")
                .ok_or_else(|| ApiError::bad("invalid parameter \"step\": missing"))?,
        )?;
        let engine = engine_for(&app, &expr, start, end).await?;
        let value = blocking(move || Ok(engine.range_expr(&expr, start, end, step)?)).await?;
        let times: Vec<i64> = (0..=(end - start) / step)
            .map(|i| start + i * step)
            .collect();
        Ok::<_, ApiError>(ok(range_json(&value, &times)))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// The matcher sets of `match[]` selectors, each narrowed to what the asker sees; for an asker that sees
/// only some clusters and gave no `match[]`, the one set of its clusters.
fn selectors(p: &Params, asker: &Asker) -> Result<Vec<Vec<Matcher>>, ApiError> {
    let scope = scope_of(asker)?;
    let mut out = Vec::new();
    let given = p.all("match[]");
    if given.is_empty()
        && let Some(m) = &scope
    {
        return Ok(vec![vec![m.clone()]]);
    }
    for m in given {
        match parse_scoped(m, &scope) {
            Ok(Expr::VectorSelector(vs)) => out.extend(promql::selector_matchers(&vs)),
            Ok(_) => {
                return Err(ApiError::bad(format!(
                    "invalid parameter \"match[]\": {m:?} is not a series selector"
                )));
            }
            Err(e) => {
                return Err(ApiError::bad(format!(
                    "invalid parameter \"match[]\": {}",
                    e.message
                )));
            }
        }
    }
    Ok(out)
}

async fn series(
    State(app): State<App>,
    asker: Asker,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    let result = async {
        let p = Params::parse(q, &body)?;
        if p.all("match[]").is_empty() {
            return Err(ApiError::bad("no match[] parameter provided"));
        }
        let sets = selectors(&p, &asker)?;
        let start = p.time("start")?;
        let end = p.time("end")?;
        let store = app.engine.store().clone();
        let remote = match &app.peers {
            Some(peers) => {
                peers
                    .series(&sets, start.unwrap_or(i64::MIN), end.unwrap_or(i64::MAX))
                    .await?
            }
            None => Vec::new(),
        };
        let mut found = blocking(move || {
            let mut out = Vec::new();
            for (id, labels) in store.select(&sets) {
                if start.is_some() || end.is_some() {
                    let samples = store
                        .samples(id, start.unwrap_or(i64::MIN), end.unwrap_or(i64::MAX))
                        .map_err(|e| ApiError::internal(e.to_string()))?;
                    if samples.is_empty() {
                        continue;
                    }
                }
                out.push((*labels).clone());
            }
            Ok(out)
        })
        .await?;
        if !remote.is_empty() {
            found.extend(remote);
            found.sort();
            found.dedup();
        }
        let mut s = String::from("[");
        for (i, l) in found.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            write_labels(&mut s, l);
        }
        s.push(']');
        Ok::<_, ApiError>(ok(s))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

fn string_list(items: &[String]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".into())
}

async fn labels(
    State(app): State<App>,
    asker: Asker,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    let result = async {
        let p = Params::parse(q, &body)?;
        let sets = selectors(&p, &asker)?;
        let store = app.engine.store().clone();
        let local_sets = sets.clone();
        let mut names = blocking(move || Ok(store.label_names(&local_sets))).await?;
        if let Some(peers) = &app.peers {
            names = peers
                .labels(Peers::labels_request(None, &sets), names)
                .await?;
        }
        Ok::<_, ApiError>(ok(string_list(&names)))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn label_values(
    State(app): State<App>,
    asker: Asker,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Response {
    let result = async {
        let p = Params::parse(q, &[])?;
        let sets = selectors(&p, &asker)?;
        let store = app.engine.store().clone();
        let (local_name, local_sets) = (name.clone(), sets.clone());
        let mut values = blocking(move || Ok(store.label_values(&local_name, &local_sets))).await?;
        if let Some(peers) = &app.peers {
            values = peers
                .labels(Peers::labels_request(Some(name), &sets), values)
                .await?;
        }
        Ok::<_, ApiError>(ok(string_list(&values)))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

fn msgpack<T: serde::Serialize>(v: &T) -> Response {
    match rmp_serde::to_vec_named(v) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, federate::CONTENT_TYPE)],
            body,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("encoding the answer: {e}")).into_response(),
    }
}

/// A peer's internal select: series and samples from the local store only.
async fn internal_select(State(app): State<App>, asker: Asker, body: Bytes) -> Response {
    let result = async {
        refuse_scoped(&asker)?;
        let req: federate::SelectRequest = rmp_serde::from_slice(&body)
            .map_err(|e| ApiError::bad(format!("not a select request: {e}")))?;
        let store = app.engine.store().clone();
        let series = blocking(move || Ok(federate::answer_select(&store, &req)?)).await?;
        Ok::<_, ApiError>(msgpack(&series))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// A peer's internal label names or values, from the local store only.
async fn internal_labels(State(app): State<App>, asker: Asker, body: Bytes) -> Response {
    let result = async {
        refuse_scoped(&asker)?;
        let req: federate::LabelsRequest = rmp_serde::from_slice(&body)
            .map_err(|e| ApiError::bad(format!("not a labels request: {e}")))?;
        let store = app.engine.store().clone();
        let names = blocking(move || Ok(federate::answer_labels(&store, &req)?)).await?;
        Ok::<_, ApiError>(msgpack(&names))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn buildinfo() -> Response {
    let data = serde_json::json!({
        "version": "2.53.0",
        "revision": concat!("multipilot-tsdb-", env!("CARGO_PKG_VERSION")),
        "branch": "",
        "buildUser": "",
        "buildDate": "",
        "goVersion": "",
    });
    ok(data.to_string())
}

/// A sample value as Prometheus writes it.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

/// A timestamp in ms as Unix seconds with up to 3 decimals (no exponent).
pub fn format_time(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let abs = ms.unsigned_abs();
    let (secs, frac) = (abs / 1000, abs % 1000);
    if frac == 0 {
        format!("{sign}{secs}")
    } else {
        let f = format!("{frac:03}");
        format!("{sign}{secs}.{}", f.trim_end_matches('0'))
    }
}

fn write_labels(out: &mut String, labels: &Labels) {
    out.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{}:{}",
            serde_json::Value::from(k.as_str()),
            serde_json::Value::from(v.as_str())
        );
    }
    out.push('}');
}

fn write_point(out: &mut String, ms: i64, v: f64) {
    let _ = write!(out, "[{},\"{}\"]", format_time(ms), format_value(v));
}

/// The `data` of an instant query.
fn instant_json(value: &Value, t: i64) -> String {
    let mut s = String::new();
    match value {
        Value::Scalar(v) => {
            s.push_str(r#"{"resultType":"scalar","result":"#);
            write_point(&mut s, t, v.first().copied().unwrap_or(f64::NAN));
            s.push('}');
        }
        Value::String(text) => {
            let _ = write!(
                s,
                r#"{{"resultType":"string","result":[{},{}]}}"#,
                format_time(t),
                serde_json::Value::from(text.as_str())
            );
        }
        Value::Vector(series) => {
            s.push_str(r#"{"resultType":"vector","result":["#);
            let mut first = true;
            for x in series {
                let Some(Some(v)) = x.values.first() else {
                    continue;
                };
                if !std::mem::take(&mut first) {
                    s.push(',');
                }
                s.push_str(r#"{"metric":"#);
                write_labels(&mut s, &x.labels);
                s.push_str(r#","value":"#);
                write_point(&mut s, t, *v);
                s.push('}');
            }
            s.push_str("]}");
        }
        Value::Matrix(series) => {
            s.push_str(r#"{"resultType":"matrix","result":["#);
            for (i, (labels, pts)) in series.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                s.push_str(r#"{"metric":"#);
                write_labels(&mut s, labels);
                s.push_str(r#","values":["#);
                for (j, (pt, pv)) in pts.iter().enumerate() {
                    if j > 0 {
                        s.push(',');
                    }
                    write_point(&mut s, *pt, *pv);
                }
                s.push_str("]}");
            }
            s.push_str("]}");
        }
    }
    s
}

/// The `data` of a range query (always a matrix).
fn range_json(value: &Value, times: &[i64]) -> String {
    let mut s = String::from(r#"{"resultType":"matrix","result":["#);
    let write_series = |s: &mut String,
                        first: &mut bool,
                        labels: &Labels,
                        vals: &mut dyn Iterator<Item = Option<f64>>| {
        if !std::mem::take(first) {
            s.push(',');
        }
        s.push_str(r#"{"metric":"#);
        write_labels(s, labels);
        s.push_str(r#","values":["#);
        let mut first_pt = true;
        for (t, v) in times.iter().zip(vals) {
            let Some(v) = v else { continue };
            if !std::mem::take(&mut first_pt) {
                s.push(',');
            }
            write_point(s, *t, v);
        }
        s.push_str("]}");
    };
    let mut first = true;
    match value {
        Value::Scalar(v) => {
            write_series(
                &mut s,
                &mut first,
                &Vec::new(),
                &mut v.iter().map(|x| Some(*x)),
            );
        }
        Value::Vector(series) => {
            for x in series {
                write_series(&mut s, &mut first, &x.labels, &mut x.values.iter().copied());
            }
        }
        Value::Matrix(_) | Value::String(_) => {}
    }
    s.push_str("]}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_like_prometheus() {
        assert_eq!(format_value(1.0), "1");
        assert_eq!(format_value(0.25), "0.25");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_time(1_700_000_000_000), "1700000000");
        assert_eq!(format_time(1_700_000_000_120), "1700000000.12");
        assert_eq!(format_time(-1_500), "-1.5");
    }

    #[test]
    fn times_and_steps_parse_both_forms() {
        assert_eq!(
            parse_time("t", "1700000000.5").ok(),
            Some(1_700_000_000_500)
        );
        assert_eq!(
            parse_time("t", "2023-11-14T22:13:20Z").ok(),
            Some(1_700_000_000_000)
        );
        assert!(parse_time("t", "yesterday").is_err());
        assert_eq!(parse_step("30").ok(), Some(30_000));
        assert_eq!(parse_step("1m30s").ok(), Some(90_000));
        assert!(parse_step("0").is_err());
        assert!(parse_step("-5").is_err());
    }
}
