//! Real Kubernetes event shapes as data, and a realistic fleet event stream made of them: what the
//! correlator's fingerprint and dedup tests, its benchmark and the throughput scenario are fed with. Test
//! and benchmark data: no role ships it.
//!
//! - [`shapes`]: the catalog (reporter, kind, reason, type, the message template as the component formats
//!   it, problem or lifecycle), each checked against its source.
//! - [`stream`]: a deterministic fleet stream of those shapes, each event with its ground-truth problem.

pub mod shapes;
pub mod stream;
