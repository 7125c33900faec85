//! The scheduler's link to the aggregator: fair-share usage comes in through the usage feed
//! ([`gpuledger_model::usage::UsageFeed`]), job events go out. Behind a trait so that the
//! service runs in tests against a feed of their own; [`HttpAggregator`] is the real one.

use std::time::Duration;

use gpuledger_model::event_json::{refusal_is_final, EventBatch, EVENTS_PATH};
use gpuledger_model::job::JobEvent;
use gpuledger_model::usage::{UsageFeed, USAGE_PATH};

/// The `source` the scheduler's event batches carry.
pub const EVENT_SOURCE: &str = "gpuledger-scheduler";

/// Where usage comes from and events go to.
pub trait AggregatorLink: Send + Sync + std::fmt::Debug {
    /// The usage feed now; an error says why it could not be read (the caller keeps the last
    /// figures).
    fn usage(&self) -> Result<UsageFeed, String>;
    /// Posts a batch of job events numbered `seq` (the aggregator drops a batch it has seen).
    fn post_events(&self, seq: u64, events: &[JobEvent]) -> Result<(), PostError>;
}

/// Why a batch of events was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostError {
    /// Not delivered (unreachable, a token not yet known, a full disk): sent again later.
    NotDelivered(String),
    /// The aggregator refused the batch itself (see
    /// [`gpuledger_model::event_json::refusal_is_final`]): its status and answer.
    Refused { status: u16, answer: String },
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostError::NotDelivered(why) => f.write_str(why),
            PostError::Refused { status, answer } => write!(f, "refused ({status}): {answer}"),
        }
    }
}

/// The aggregator's HTTP API, with an operator token when it runs with `--tokens`.
#[derive(Debug)]
pub struct HttpAggregator {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl HttpAggregator {
    /// A client of the aggregator at `base` (`http(s)://host:port`), trusting `tls`.
    pub fn new(base: &str, token: Option<String>, tls: ureq::tls::TlsConfig) -> Self {
        HttpAggregator {
            base: base.trim_end_matches('/').to_owned(),
            token,
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(5)))
                .tls_config(tls)
                .build()
                .into(),
        }
    }

    fn bearer(&self) -> Option<String> {
        self.token.as_ref().map(|t| format!("Bearer {t}"))
    }
}

impl AggregatorLink for HttpAggregator {
    fn usage(&self) -> Result<UsageFeed, String> {
        let url = format!("{}{USAGE_PATH}", self.base);
        let mut request = self.agent.get(&url);
        if let Some(bearer) = self.bearer() {
            request = request.header("authorization", bearer);
        }
        let text = request
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
            .map_err(|e| format!("{url}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("{url}: not a usage feed: {e}"))
    }

    fn post_events(&self, seq: u64, events: &[JobEvent]) -> Result<(), PostError> {
        let url = format!("{}{EVENTS_PATH}", self.base);
        let body = serde_json::to_string(&EventBatch::of(EVENT_SOURCE, seq, events))
            .map_err(|e| PostError::NotDelivered(format!("encoding events: {e}")))?;
        let mut request = self
            .agent
            .post(&url)
            .config()
            .http_status_as_error(false)
            .build()
            .header("content-type", "application/json");
        if let Some(bearer) = self.bearer() {
            request = request.header("authorization", bearer);
        }
        let mut reply = request
            .send(body.as_bytes())
            .map_err(|e| PostError::NotDelivered(format!("{url}: {e}")))?;
        let status = reply.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let answer = reply.body_mut().read_to_string().unwrap_or_default();
        if refusal_is_final(status) {
            Err(PostError::Refused { status, answer })
        } else {
            Err(PostError::NotDelivered(format!("{url}: {status} {answer}")))
        }
    }
}
