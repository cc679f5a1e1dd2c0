//! The notifier: alerts posted to an Alertmanager-compatible `POST /api/v2/alerts` (the alert router).

use std::time::Duration;

use super::eval::PostableAlert;

/// Where alerts are sent.
#[derive(Debug, Clone)]
pub struct Notifier {
    client: reqwest::Client,
    url: String,
    token: Option<String>,
}

impl Notifier {
    /// Posts to `<base>/api/v2/alerts`, with `token` as a bearer token when set.
    pub fn new(base: &str, token: Option<String>) -> Self {
        Notifier {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
            url: format!("{}/api/v2/alerts", base.trim_end_matches('/')),
            token,
        }
    }

    /// Sends alerts (a failure is logged: the next evaluation sends them again).
    pub async fn send(&self, alerts: &[PostableAlert]) {
        if alerts.is_empty() {
            return;
        }
        let mut req = self.client.post(&self.url).json(alerts);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => {
                tracing::warn!(url = %self.url, status = %r.status(), "alertmanager refused alerts")
            }
            Err(e) => tracing::warn!(url = %self.url, error = %e, "could not send alerts"),
        }
    }
}
