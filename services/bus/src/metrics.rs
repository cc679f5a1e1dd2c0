//! The bus' Prometheus metrics (`multipilot_bus_*`). Label values come from small fixed sets: outcomes,
//! reason classes and durable consumer names, never a cluster or object name.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Consumed {
    consumer: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByConsumer {
    consumer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeadLettered {
    consumer: String,
    reason: String,
}

/// Counters of what the bus did. Cheap to clone (shared underneath).
#[derive(Clone, Debug, Default)]
pub struct BusMetrics {
    published: Family<Outcome, Counter>,
    consumed: Family<Consumed, Counter>,
    admitted: Family<ByConsumer, Counter>,
    dead_letters: Family<DeadLettered, Counter>,
}

impl BusMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = BusMetrics::default();
        registry.register(
            "multipilot_bus_published",
            "Messages published, by outcome (stored, duplicate, failed)",
            m.published.clone(),
        );
        registry.register(
            "multipilot_bus_consumed",
            "Messages consumed, by consumer and outcome (done, retry, dead_letter, rate_limited)",
            m.consumed.clone(),
        );
        registry.register(
            "multipilot_bus_admitted",
            "Messages let in by the consumer's input limiter (all messages handled, when no limit is set)",
            m.admitted.clone(),
        );
        registry.register(
            "multipilot_bus_dead_letters",
            "Messages dead-lettered, by consumer and reason class",
            m.dead_letters.clone(),
        );
        m
    }

    pub(crate) fn published(&self, outcome: &str) {
        self.published
            .get_or_create(&Outcome {
                outcome: outcome.into(),
            })
            .inc();
    }

    pub(crate) fn consumed(&self, consumer: &str, outcome: &str) {
        self.consumed
            .get_or_create(&Consumed {
                consumer: consumer.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    pub(crate) fn admitted(&self, consumer: &str) {
        self.admitted
            .get_or_create(&ByConsumer {
                consumer: consumer.into(),
            })
            .inc();
    }

    pub(crate) fn dead_lettered(&self, consumer: &str, reason: &str) {
        self.dead_letters
            .get_or_create(&DeadLettered {
                consumer: consumer.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Messages dead-lettered so far by a consumer for a reason class.
    pub fn dead_letters(&self, consumer: &str, reason: &str) -> u64 {
        self.dead_letters
            .get_or_create(&DeadLettered {
                consumer: consumer.into(),
                reason: reason.into(),
            })
            .get()
    }

    /// Messages consumed so far by a consumer with an outcome.
    pub fn consumed_count(&self, consumer: &str, outcome: &str) -> u64 {
        self.consumed
            .get_or_create(&Consumed {
                consumer: consumer.into(),
                outcome: outcome.into(),
            })
            .get()
    }
}
