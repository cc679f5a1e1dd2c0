//! Request/reply subjects between hub roles (JSON bodies): the incident queries and commands the console and
//! the CLI send to the correlator. With partitions, every correlator instance answers for its part and
//! sets [`HEADER_PARTITIONS`], so the asker knows how many answers to gather (see
//! `multipilot_bus::request::gather`).

use serde::{Deserialize, Serialize};

use crate::payload::Incident;

/// Subject answering the current incidents (request [`IncidentsQuery`], reply a JSON array of
/// [`Incident`]).
pub const QUERY_INCIDENTS: &str = "fleet.query.incidents";
/// Subject answering the current compliance reports (request `{}`, reply a JSON array of
/// [`crate::payload::ComplianceReport`]).
pub const QUERY_COMPLIANCE: &str = "fleet.query.compliance";
/// Subject of incident commands (request [`IncidentCommand`], reply [`CommandReply`]).
pub const COMMAND_INCIDENT: &str = "fleet.ctl.incident";
/// Header on replies from partitioned roles: how many instances answer.
pub const HEADER_PARTITIONS: &str = "Multipilot-Partitions";

/// The request on [`QUERY_INCIDENTS`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IncidentsQuery {
    /// Resolved incidents of the last week too, not only open and acknowledged ones.
    pub all: bool,
}

/// What a person does to an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IncidentAction {
    /// Acknowledge: someone is on it.
    Ack,
    /// Resolve by hand: it is over (a condition still failing opens a new incident).
    Resolve,
}

impl IncidentAction {
    /// The action's name (`ack`, `resolve`).
    pub fn name(self) -> &'static str {
        match self {
            IncidentAction::Ack => "ack",
            IncidentAction::Resolve => "resolve",
        }
    }
}

/// A request on [`COMMAND_INCIDENT`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentCommand {
    /// Incident id.
    pub id: String,
    /// What to do.
    pub action: IncidentAction,
    /// Who does it (the console's token subject).
    pub actor: String,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommandOutcome {
    /// Changed: a new revision and an audit record are published.
    Done,
    /// Already so (acknowledging an acknowledged incident): nothing published.
    Unchanged,
    /// This instance has no incident with that id.
    NotFound,
    /// Not possible in the incident's state (acknowledging a resolved incident).
    Conflict,
    /// The change could not be made durable or published; try again.
    Failed,
}

/// The reply on [`COMMAND_INCIDENT`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandReply {
    /// Outcome.
    pub outcome: CommandOutcome,
    /// The incident after the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<Incident>,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl CommandReply {
    /// A reply without an error.
    pub fn new(outcome: CommandOutcome, incident: Option<Incident>) -> Self {
        CommandReply {
            outcome,
            incident,
            error: None,
        }
    }

    /// A failed command.
    pub fn failed(error: impl Into<String>, incident: Option<Incident>) -> Self {
        CommandReply {
            outcome: CommandOutcome::Failed,
            incident,
            error: Some(error.into()),
        }
    }
}
