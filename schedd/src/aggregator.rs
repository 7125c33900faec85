//! The scheduler's link to the aggregator: fair-share usage comes in through the usage feed
//! ([`gpuledger_model::usage::UsageFeed`]), job events go out. Behind a trait so that the
//! service runs in tests against a feed of their own; [`HttpAggregator`] is the real one.

use std::time::Duration;

use gpuledger_model::event_json::{EventBatch, EVENTS_PATH};
use gpuledger_model::job::JobEvent;
use gpuledger_model::usage::{UsageFeed, USAGE_PATH};

/// Where usage comes from and events go to.
pub trait AggregatorLink: Send + Sync + std::fmt::Debug {
    /// The usage feed now; an error says why it could not be read (the caller keeps the last
    /// figures).
    fn usage(&self) -> Result<UsageFeed, String>;
    /// Posts a batch of job events numbered `seq` (the aggregator drops a batch it has seen).
    fn post_events(&self, seq: u64, events: &[JobEvent]) -> Result<(), String>;
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

    fn post_events(&self, seq: u64, events: &[JobEvent]) -> Result<(), String> {
        let url = format!("{}{EVENTS_PATH}", self.base);
        let body = serde_json::to_string(&EventBatch::of("gpuledger-scheduler", seq, events))
            .map_err(|e| format!("encoding events: {e}"))?;
        let mut request = self
            .agent
            .post(&url)
            .header("content-type", "application/json");
        if let Some(bearer) = self.bearer() {
            request = request.header("authorization", bearer);
        }
        request
            .send(body.as_bytes())
            .map(drop)
            .map_err(|e| format!("{url}: {e}"))
    }
}
