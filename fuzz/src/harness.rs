//! What each fuzz target does with its input. The fuzz targets call these; the main test suite
//! compiles this same file (`tests/tests/fuzz_corpus.rs`) and replays the kept corpus and every
//! past finding through it, so a fixed crash stays fixed without nightly or cargo-fuzz.
//!
//! Any outcome but a panic, an abort or a broken invariant is fine: garbage is refused.

use gpuledger_billing::PriceBook;
use gpuledger_exporter::{dcgm, promtext};
use gpuledger_model::config::UnknownTenants;
use gpuledger_model::inventory::NodeFacts;
use gpuledger_model::validate::{rebook_unknown_tenants, validate_samples, Rules};
use gpuledger_model::{wire, ClusterConfig, GpuModel, Inventory};

/// 2026-11-01T00:00:00Z: the "now" ingest checks are made against.
const NOW_MS: i64 = 1_761_955_200_000;

/// An `/api/v1/ingest` body: decoded and checked as the aggregator does. A batch that passes
/// must survive re-encoding unchanged (it is what the write-ahead log stores).
pub fn ingest_samples(data: &[u8]) {
    let Ok(batch) = wire::decode_ipc(data) else {
        return;
    };
    // The corpus's node, with the accounts its rows name; unknown tenants are booked to the
    // platform, so the rebooking runs too.
    let inventory = Inventory::new(
        [(
            "node000".to_owned(),
            NodeFacts {
                gpus: 8,
                gpu_model: GpuModel::H100Sxm,
            },
        )],
        [("team-a".to_owned(), vec!["llm".to_owned()])],
        UnknownTenants::Platform,
    );
    let rules = Rules {
        node: "node000",
        inventory: &inventory,
        now_ms: NOW_MS,
        future_tolerance_ms: 300_000,
        max_age_ms: 90 * 86_400_000,
    };
    if let Err(refusal) = validate_samples(&batch, &rules) {
        assert!(!refusal.errors.is_empty() && refusal.errors.len() <= refusal.total);
        for e in &refusal.errors {
            let _ = e.to_string();
        }
        let bad = refusal.bad_row_count(batch.num_rows());
        assert!(bad <= batch.num_rows() && (bad >= 1 || refusal.bad_rows.is_empty()));
        if !refusal.refuses_every_row() {
            let good = refusal
                .good_rows_of(&batch)
                .expect("the good rows of a batch");
            assert_eq!(good.num_rows(), batch.num_rows() - bad);
            assert!(
                validate_samples(&good, &rules).is_ok(),
                "the good rows pass alone"
            );
        }
        return;
    }
    if let Some((rebooked, rows)) =
        rebook_unknown_tenants(&batch, &inventory).expect("a valid batch can be rebooked")
    {
        assert!(rows > 0 && rebooked.num_rows() == batch.num_rows());
    }
    let logged = wire::encode_ipc(&batch).expect("a valid batch encodes");
    let replayed = wire::decode_ipc(&logged).expect("what was logged decodes");
    assert_eq!(
        replayed, batch,
        "the write-ahead log would change the batch"
    );
}

/// An `/api/v1/events` body: parsed as the aggregator does; a parse that succeeds gives one
/// event per row.
pub fn ingest_events(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Some(rows) = value.get("events").and_then(|e| e.as_array()) else {
        return;
    };
    let parsed = gpuledger_model::event_json::parse_event_rows(rows);
    assert_eq!(parsed.events.len(), rows.len());
    assert!(parsed.errors.len() <= parsed.total);
    for e in &parsed.errors {
        let _ = e.to_string();
        assert!(e.row.is_some_and(|r| parsed.events[r].is_none()), "{e}");
    }
    let bad = parsed.events.iter().filter(|e| e.is_none()).count();
    assert_eq!(bad == 0, parsed.total == 0);
}

/// A cluster config file: parsed and validated; an error's message (which locates its line)
/// is rendered, a config that passes is expanded into nodes and tenants.
pub fn cluster_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match ClusterConfig::from_toml_str(text, "fuzz.toml") {
        Ok(config) => {
            let nodes = config.nodes();
            let gpus: u64 = nodes.iter().map(|n| u64::from(n.gpus)).sum();
            assert_eq!(gpus, config.total_gpus());
            let _ = config.tenants();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// A price book file: parsed and validated; one that passes is asked for prices and
/// time-of-use bands across its versions' dates.
pub fn price_book(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match PriceBook::from_toml_str(text, "fuzz-prices.toml") {
        Ok(book) => {
            for secs in [
                0,
                1_700_000_000,
                1_761_955_200,
                1_893_456_000,
                i64::from(i32::MAX),
            ] {
                if let Ok((version, tz)) = book.at(secs) {
                    let _ = version.band_at(tz, secs);
                }
                for model in GpuModel::ALL {
                    let _ = book.gpu_hour_price(secs, model);
                }
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// A dcgm-exporter `/metrics` page: parsed as Prometheus text, then read into devices.
pub fn dcgm_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match promtext::parse(text) {
        Ok(samples) => {
            let _ = dcgm::interpret_with("http://fuzz/metrics", &samples, Some("project"));
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}
