//! `multipilot-loadtest`: runs the whole system (nats-server, hub roles, fleet simulator, agents) on this
//! machine, drives a scenario, and writes a report with figures, checks and plots.
//!
//! Scenarios: `steady`, `storm`, `fault`, `crash`, `scaleout`, `throughput` (see each module). Every scenario has a short
//! variant (`--short`) that `./scripts/test` runs to assert its invariants (nothing lost, bounds held, no
//! duplicates); timings are reported as goals, never asserted.

pub mod observe;
pub mod plot;
pub mod proc;
pub mod record;
pub mod report;
pub mod scenario;
pub mod system;
