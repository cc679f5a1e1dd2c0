//! The compliance view: each baseline rule once across the fleet, with the clusters failing it.

use multipilot_schemas::control::{RuleCompliance, compliance_by_rule};

use super::*;

/// Every rule, the most failed first, from each cluster's latest compliance report.
pub fn compliance(st: &Store) -> Vec<RuleCompliance> {
    let reports: Vec<_> = st
        .clusters
        .values()
        .filter_map(|c| c.compliance.clone())
        .collect();
    compliance_by_rule(&reports)
}

pub(super) async fn compliance_view(State(app): State<App>) -> ApiResult<Vec<RuleCompliance>> {
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    Ok(axum::Json(compliance(&st)))
}
