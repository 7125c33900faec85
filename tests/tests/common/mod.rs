//! The aggregator's router over a real data directory, driven with `tower::ServiceExt::oneshot`:
//! what the HTTP API tests share.

#![allow(dead_code)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpuledger_aggregator::http::{router, Service};
use gpuledger_aggregator::layout::Layout;
use gpuledger_aggregator::metrics::Metrics;
use gpuledger_aggregator::query::Query;
use gpuledger_aggregator::store::{Store, StoreOptions};
use gpuledger_aggregator::wal::encode_ipc;
use gpuledger_aggregator::{Ingestor, IngestorConfig};
use gpuledger_model::time::ManualClock;
use gpuledger_model::wire::{NODE_HEADER, SEQ_HEADER};
use gpuledger_model::ClusterConfig;
use gpuledger_tests::{sample_batch, small_cluster_toml};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

pub const T0: i64 = 1_780_272_000_000; // 2026-06-01T00:00:00Z

pub struct Api {
    pub app: axum::Router,
    pub service: Arc<Service>,
    pub _dir: tempfile::TempDir,
}

/// The API of a two-node cluster (accounts alpha, beta, gamma) with authentication off, at
/// 02:00 on 2026-06-01.
pub async fn api() -> Api {
    api_with(gpuledger_auth::Guard::off()).await
}

/// The same with `guard` deciding who may do what.
pub async fn api_with(guard: gpuledger_auth::Guard) -> Api {
    let dir = tempfile::tempdir().unwrap();
    let config = ClusterConfig::from_toml_str(&small_cluster_toml(2), "small.toml").unwrap();
    let store = Arc::new(
        Store::open(
            dir.path(),
            StoreOptions {
                max_rows_per_file: None,
                ..StoreOptions::default()
            },
        )
        .unwrap(),
    );
    let clock = Arc::new(ManualClock::new(T0 + 2 * 3_600_000));
    let rules = IngestorConfig::new(gpuledger_model::Inventory::from_config(&config));
    let (ingestor, _) = Ingestor::open_durable(store, rules, clock.clone()).unwrap();
    let service = Arc::new(Service {
        ingestor: Arc::new(ingestor),
        query: Query::open(&Layout::new(dir.path())).await.unwrap(),
        sql: gpuledger_aggregator::sql_api::SqlApi::open(
            &Layout::new(dir.path()),
            gpuledger_aggregator::sql_api::SqlLimits::default(),
        )
        .await
        .unwrap(),
        metrics: Metrics::new(&config),
        config,
        clock,
        guard,
        body_budget: gpuledger_service::BodyBudget::new(
            gpuledger_model::units::ByteSize(256 << 20),
            gpuledger_aggregator::http::MAX_BODY_BYTES as u64,
        ),
        sessions: gpuledger_auth::Sessions::new(43_200, false),
        ready: std::sync::atomic::AtomicBool::new(false),
        invoices_root: Layout::new(dir.path()).invoices_root(),
    });
    Api {
        app: router(Arc::clone(&service)),
        service,
        _dir: dir,
    }
}

fn bearer(
    request: axum::http::request::Builder,
    token: Option<&str>,
) -> axum::http::request::Builder {
    match token {
        Some(t) => request.header("authorization", format!("Bearer {t}")),
        None => request,
    }
}

impl Api {
    pub async fn call(&self, request: Request<Body>) -> (StatusCode, Value, String) {
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        (status, json, text)
    }

    pub async fn ingest(&self, node: &str, seq: u64, body: Vec<u8>) -> (StatusCode, Value) {
        self.ingest_as(None, node, seq, body).await
    }

    pub async fn ingest_as(
        &self,
        token: Option<&str>,
        node: &str,
        seq: u64,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let request = bearer(Request::post("/api/v1/ingest"), token)
            .header(NODE_HEADER, node)
            .header(SEQ_HEADER, seq.to_string())
            .body(Body::from(body))
            .unwrap();
        let (status, json, _) = self.call(request).await;
        (status, json)
    }

    pub async fn get(&self, uri: &str) -> (StatusCode, Value, String) {
        self.get_as(None, uri).await
    }

    pub async fn get_as(&self, token: Option<&str>, uri: &str) -> (StatusCode, Value, String) {
        self.call(
            bearer(Request::get(uri), token)
                .body(Body::empty())
                .unwrap(),
        )
        .await
    }

    pub async fn post_json(&self, uri: &str, body: Value) -> (StatusCode, Value) {
        self.post_json_as(None, uri, body).await
    }

    pub async fn post_json_as(
        &self,
        token: Option<&str>,
        uri: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let request = bearer(Request::post(uri), token)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let (status, json, _) = self.call(request).await;
        (status, json)
    }

    /// Flushes and returns (rows, GPU-seconds) in the stored samples.
    pub async fn stored(&self) -> (i64, i64) {
        let ingestor = Arc::clone(&self.service.ingestor);
        tokio::task::spawn_blocking(move || ingestor.flush().unwrap())
            .await
            .unwrap();
        let batches = self
            .service
            .query
            .sql("SELECT COUNT(*) AS n, COALESCE(SUM(interval_s), 0) AS s FROM samples")
            .await
            .unwrap();
        let rows = gpuledger_aggregator::query::batch_to_json_rows(&batches[0]).unwrap();
        (
            rows[0]["n"].as_i64().unwrap(),
            rows[0]["s"].as_i64().unwrap(),
        )
    }
}

/// Rows `range` of the sample fixture (alpha's jobs 1000-1003 on two GPUs in three) as an
/// Arrow IPC body.
pub fn ipc(range: std::ops::Range<usize>, node: &str) -> Vec<u8> {
    encode_ipc(&sample_batch(range, T0, node)).unwrap()
}
