//! The console's metrics (`multipilot_console_*`), defined in one place. Label values come from fixed sets:
//! feed names, decode reason classes, route templates and status classes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FeedLabel {
    feed: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SkipLabel {
    feed: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteOnly {
    route: String,
}

/// The console's metrics. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    applied: Family<FeedLabel, Counter>,
    skipped: Family<SkipLabel, Counter>,
    requests: Family<RouteLabel, Counter>,
    latency: Family<RouteOnly, Histogram>,
    /// Objects in the store.
    pub objects: Gauge,
    /// Live incident streams open.
    pub sse_clients: Gauge,
}

fn buckets() -> Histogram {
    Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0])
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics {
            applied: Family::default(),
            skipped: Family::default(),
            requests: Family::default(),
            latency: Family::new_with_constructor(buckets),
            objects: Gauge::default(),
            sse_clients: Gauge::default(),
        };
        registry.register(
            "multipilot_console_applied",
            "Stream messages applied to the console's picture of the fleet, by feed",
            m.applied.clone(),
        );
        registry.register(
            "multipilot_console_skipped",
            "Stream messages the console could not use, by feed and reason class",
            m.skipped.clone(),
        );
        registry.register(
            "multipilot_console_requests",
            "API requests, by route and status class",
            m.requests.clone(),
        );
        registry.register(
            "multipilot_console_request_duration_seconds",
            "API request latency, by route",
            m.latency.clone(),
        );
        registry.register(
            "multipilot_console_objects",
            "Kubernetes objects the console holds",
            m.objects.clone(),
        );
        registry.register(
            "multipilot_console_sse_clients",
            "Live incident streams open",
            m.sse_clients.clone(),
        );
        m
    }

    pub(crate) fn applied(&self, feed: &str) {
        self.applied
            .get_or_create(&FeedLabel { feed: feed.into() })
            .inc();
    }

    pub(crate) fn skipped(&self, feed: &str, reason: &str) {
        self.skipped
            .get_or_create(&SkipLabel {
                feed: feed.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Messages skipped so far on a feed for a reason class.
    pub fn skipped_count(&self, feed: &str, reason: &str) -> u64 {
        self.skipped
            .get_or_create(&SkipLabel {
                feed: feed.into(),
                reason: reason.into(),
            })
            .get()
    }

    pub(crate) fn request(&self, route: &str, status: u16, seconds: f64) {
        let class = match status {
            200..=299 => "2xx",
            400..=499 => "4xx",
            500..=599 => "5xx",
            _ => "other",
        };
        self.requests
            .get_or_create(&RouteLabel {
                route: route.into(),
                status: class.into(),
            })
            .inc();
        self.latency
            .get_or_create(&RouteOnly {
                route: route.into(),
            })
            .observe(seconds);
    }
}
