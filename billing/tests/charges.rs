//! Hand-checked cases from the seed, exactness properties against simple references, FOCUS
//! columns and golden files for the rendered invoices.

use gpuledger_billing::pricebook::PriceBook;
use gpuledger_billing::render::{focus_csv, invoice_csv, invoice_html, FOCUS_MANDATORY};
use gpuledger_billing::{
    charge, revise, split_largest_remainder, BillingInput, BillingModel, ChargeType, IdleHour,
    Invoice, Period, Reservation, StorageScan, UsageHour,
};
use gpuledger_model::{AccountId, GpuModel, JobId, NodeId, ProjectId};
use proptest::prelude::*;
use rust_decimal::Decimal;
use rust_decimal_macros::dec;

const JUNE: i64 = 1_780_272_000; // 2026-06-01T00:00:00Z

fn book(extra: &str) -> PriceBook {
    let src = format!(
        r#"[[versions]]
version = "2026-06"
effective_from = "2026-05-01"
currency = "CNY"
gpu_hour = {{ h100-sxm = "10.00", a100 = "5.00" }}
{extra}"#
    );
    PriceBook::from_toml_str(&src, "test-prices.toml").unwrap()
}

const NIGHT_BAND: &str = r#"
[[versions.time_of_use]]
name = "off-peak-night"
hours = { from = 20, to = 8 }
multiplier = "0.50"
"#;

fn acct(s: &str) -> AccountId {
    AccountId::new(s).unwrap()
}

struct Use {
    account: &'static str,
    project: Option<&'static str>,
    job: Option<&'static str>,
    node: &'static str,
    model: GpuModel,
    hour: i64,
    secs: i64,
    mfu_bp: Option<u32>,
}

fn usage(u: Use) -> UsageHour {
    UsageHour {
        account: acct(u.account),
        project: u.project.map(|p| ProjectId::new(p).unwrap()),
        job_id: u.job.map(|j| JobId::new(j).unwrap()),
        node: NodeId::new(u.node).unwrap(),
        gpu_model: u.model,
        hour_start: JUNE + u.hour * 3600,
        gpu_seconds: u.secs,
        quarter_seconds: None,
        mfu_bp: u.mfu_bp,
    }
}

/// `gpus` GPUs of `account` busy for each hour in `hours` (hour offsets from June 1st).
fn busy(
    account: &'static str,
    job: &'static str,
    gpus: i64,
    hours: impl Iterator<Item = i64>,
) -> Vec<UsageHour> {
    hours
        .map(|h| {
            usage(Use {
                account,
                project: Some("main"),
                job: Some(job),
                node: "n001",
                model: GpuModel::H100Sxm,
                hour: h,
                secs: gpus * 3600,
                mfu_bp: None,
            })
        })
        .collect()
}

fn june() -> Period {
    Period::month("2026-06").unwrap()
}

fn total_of(invoices: &[Invoice], account: &str) -> Decimal {
    invoices
        .iter()
        .find(|i| i.account.as_str() == account)
        .map(Invoice::total)
        .unwrap()
}

#[test]
fn day_and_night_teams_pay_the_same_flat_and_night_pays_less_off_peak() {
    // Team A: 256 GPUs 08:00-20:00 UTC; team B: 256 GPUs 20:00-08:00, every day of June.
    let mut u = Vec::new();
    for day in 0..30 {
        u.extend(busy("team-a", "a1", 256, (8..20).map(|h| day * 24 + h)));
        u.extend(busy(
            "team-b",
            "b1",
            256,
            (20..32).map(|h| day * 24 + h).filter(|h| *h < 30 * 24),
        ));
        u.extend(busy("team-b", "b1", 256, (0..8).filter(|_| day == 0)));
    }
    let input = BillingInput {
        usage: u,
        ..BillingInput::default()
    };
    let flat = charge(&june(), &input, &book(""), None).unwrap();
    let expected = Decimal::from(256 * 12 * 30 * 10);
    assert_eq!(total_of(&flat, "team-a"), expected);
    assert_eq!(total_of(&flat, "team-b"), expected);

    let tou = charge(&june(), &input, &book(NIGHT_BAND), None).unwrap();
    assert_eq!(total_of(&tou, "team-a"), expected);
    assert_eq!(total_of(&tou, "team-b"), expected / dec!(2));
    let b = tou.iter().find(|i| i.account.as_str() == "team-b").unwrap();
    assert!(b
        .lines
        .iter()
        .all(|l| l.key.band == "off-peak-night" && l.unit_price == dec!(5.000)));
}

fn reservation(nodes: Vec<&str>) -> Reservation {
    Reservation {
        id: "resv-e".into(),
        account: acct("team-e"),
        project: None,
        gpu_model: GpuModel::H100Sxm,
        gpus: 64 * 8,
        nodes: nodes.into_iter().map(|n| NodeId::new(n).unwrap()).collect(),
        start: JUNE + 2 * 86_400,
        end: JUNE + 9 * 86_400,
    }
}

#[test]
fn a_64_node_reservation_for_7_days_locks_86016_gpu_hours() {
    let r = reservation(Vec::new());
    assert_eq!(r.reserved_gpu_seconds(), 86_016 * 3600);
    let input = BillingInput {
        reservations: vec![r.clone()],
        ..BillingInput::default()
    };
    let inv = charge(&june(), &input, &book(""), None).unwrap();
    assert_eq!(inv.len(), 1);
    let line = &inv[0].lines[0];
    assert_eq!(line.key.charge_type, ChargeType::ReservationUnused);
    assert_eq!(line.quantity, dec!(86016));
    assert_eq!(line.amount, dec!(860160.00));

    // Used hours inside the reservation are billed as usage, the rest as unused: 86,016 in all.
    let mut used = busy("team-e", "e1", 512, 48..58);
    used.extend(busy("team-x", "x1", 8, 48..50)); // another account's use does not count
    let input = BillingInput {
        usage: used,
        reservations: vec![r],
        ..BillingInput::default()
    };
    let inv = charge(&june(), &input, &book(""), None).unwrap();
    let e = inv.iter().find(|i| i.account.as_str() == "team-e").unwrap();
    let hours: Decimal = e.lines.iter().map(|l| l.quantity).sum();
    assert_eq!(hours, dec!(86016));
    assert_eq!(e.total(), dec!(860160.00));
}

#[test]
fn a_reservation_on_named_nodes_counts_only_use_on_those_nodes() {
    let r = reservation(vec!["n001"]);
    let mut elsewhere = busy("team-e", "e1", 8, 48..49);
    elsewhere[0].node = NodeId::new("n999").unwrap();
    let input = BillingInput {
        usage: elsewhere,
        reservations: vec![r],
        ..BillingInput::default()
    };
    let inv = charge(&june(), &input, &book(""), None).unwrap();
    let unused: Decimal = inv[0]
        .lines
        .iter()
        .filter(|l| l.key.charge_type == ChargeType::ReservationUnused)
        .map(|l| l.quantity)
        .sum();
    assert_eq!(unused, dec!(86016));
}

#[test]
fn mfu_weighted_pays_the_mfu_share_or_the_floor() {
    let models = r#"
[versions.models]
default = "mfu_weighted"
"#;
    let mk = |bp| {
        usage(Use {
            account: "team-c",
            project: None,
            job: Some("c1"),
            node: "n001",
            model: GpuModel::H100Sxm,
            hour: 10,
            secs: 8 * 3600,
            mfu_bp: bp,
        })
    };
    let price = |bp| {
        let input = BillingInput {
            usage: vec![mk(bp)],
            ..BillingInput::default()
        };
        charge(&june(), &input, &book(models), None).unwrap()[0].total()
    };
    assert_eq!(price(Some(3000)), dec!(24.00)); // 8 GPU-hours x 10 x 0.3
    assert_eq!(price(Some(500)), dec!(8.00)); // below the 0.1 floor
    assert_eq!(price(None), dec!(80.00)); // not measured: full price
    let inv = charge(
        &june(),
        &BillingInput {
            usage: vec![mk(Some(3000))],
            ..BillingInput::default()
        },
        &book(models),
        None,
    )
    .unwrap();
    assert_eq!(inv[0].lines[0].mfu_factor, Some(dec!(0.3)));
    assert_eq!(inv[0].billing_model, Some(BillingModel::MfuWeighted));
}

#[test]
fn shared_idle_capacity_is_split_exactly_by_usage() {
    let idle = r#"
[versions.idle]
policy = "shared"
"#;
    let mut u = busy("team-a", "a1", 1, 0..1);
    u.extend(busy("team-b", "b1", 2, 0..1));
    let input = BillingInput {
        usage: u,
        idle: vec![IdleHour {
            node: NodeId::new("n001").unwrap(),
            gpu_model: GpuModel::H100Sxm,
            hour_start: JUNE,
            gpu_seconds: 3600 + 1, // 10.0027.. CNY: 10.00 split 1:2 -> 3.33 + 6.67
            quarter_seconds: None,
        }],
        ..BillingInput::default()
    };
    let inv = charge(&june(), &input, &book(idle), None).unwrap();
    let share = |a: &str| {
        let i = inv.iter().find(|i| i.account.as_str() == a).unwrap();
        i.lines
            .iter()
            .find(|l| l.key.charge_type == ChargeType::IdleShare)
            .unwrap()
            .clone()
    };
    assert_eq!(share("team-a").amount + share("team-b").amount, dec!(10.00));
    assert_eq!(share("team-a").amount, dec!(3.33));
    assert_eq!(
        share("team-a").gpu_seconds + share("team-b").gpu_seconds,
        3601
    );

    let platform = charge(
        &june(),
        &input,
        &book("[versions.idle]\npolicy = \"platform\"\n"),
        None,
    )
    .unwrap();
    assert_eq!(total_of(&platform, "platform"), dec!(10.00));
}

#[test]
fn storage_is_billed_in_tb_days_to_accounts_that_pay_for_it() {
    let storage = r#"
[versions.storage]
tb_day = "2.00"
max_hold = "1d"
[versions.models]
default = "gpu_hours"
accounts = { team-d = "compute_and_storage" }
"#;
    let scan = |account: &str, day: i64, tb: u64| StorageScan {
        account: acct(account),
        project: Some(ProjectId::new("ckpt").unwrap()),
        time: JUNE + day * 86_400,
        bytes: tb * 1_000_000_000_000,
    };
    // Daily scans of 3 TB for ten days, then nothing: 3 x 10 TB-days (the last holds 1 day).
    let mut scans: Vec<StorageScan> = (0..10).map(|d| scan("team-d", d, 3)).collect();
    scans.push(scan("team-a", 0, 100)); // team-a's model does not bill storage
    let input = BillingInput {
        storage: scans,
        ..BillingInput::default()
    };
    let inv = charge(&june(), &input, &book(storage), None).unwrap();
    assert_eq!(inv.len(), 1);
    assert_eq!(inv[0].lines[0].quantity, dec!(30));
    assert_eq!(inv[0].total(), dec!(60.00));
    // The comparison prices team-a's storage when forced onto the storage model.
    let forced = charge(
        &june(),
        &input,
        &book(storage),
        Some(BillingModel::ComputeAndStorage),
    )
    .unwrap();
    assert_eq!(total_of(&forced, "team-a"), dec!(200.00));
}

#[test]
fn storage_standing_across_a_price_version_change_is_priced_by_each_version() {
    // Versions take effect at local midnight in Shanghai: v2 from 2026-06-15T16:00Z.
    let version = |name: &str, from: &str, tb_day: &str| {
        format!(
            "[[versions]]\nversion = \"{name}\"\neffective_from = \"{from}\"\ncurrency = \"CNY\"\n\
             time_zone = \"Asia/Shanghai\"\ngpu_hour = {{ h100-sxm = \"10.00\" }}\n\
             [versions.storage]\ntb_day = \"{tb_day}\"\nmax_hold = \"1d\"\n\
             [versions.models]\ndefault = \"compute_and_storage\"\n"
        )
    };
    let src = version("v1", "2026-05-01", "3.00") + &version("v2", "2026-06-16", "6.00");
    let book = PriceBook::from_toml_str(&src, "two-versions.toml").unwrap();
    // 1 TB from the 15th 12:00 UTC, standing one day: 4 h under v1 (0.50), 20 h under v2 (5.00).
    let input = BillingInput {
        storage: vec![StorageScan {
            account: acct("team-d"),
            project: None,
            time: JUNE + 14 * 86_400 + 12 * 3600,
            bytes: 1_000_000_000_000,
        }],
        ..BillingInput::default()
    };
    let inv = charge(&june(), &input, &book, None).unwrap();
    let by_version: Vec<(String, Decimal)> = inv[0]
        .lines
        .iter()
        .map(|l| (l.key.price_book_version.clone(), l.amount))
        .collect();
    assert_eq!(
        by_version,
        [("v1".to_owned(), dec!(0.50)), ("v2".to_owned(), dec!(5.00))]
    );
    assert_eq!(inv[0].total(), dec!(5.50));
}

#[test]
fn a_book_west_of_utc_starting_on_the_1st_bills_the_whole_utc_month() {
    // New York's midnight of March 1st is 05:00 UTC: the UTC month's first five hours come
    // before the book's first version, which prices them (there is no earlier price).
    let src =
        "[[versions]]\nversion = \"v1\"\neffective_from = \"2026-03-01\"\ncurrency = \"USD\"\n\
               time_zone = \"America/New_York\"\ngpu_hour = { h100-sxm = \"10.00\" }\n\
               [versions.idle]\npolicy = \"platform\"\n";
    let book = PriceBook::from_toml_str(src, "west.toml").unwrap();
    let march = Period::month("2026-03").unwrap();
    let mut hour = usage(Use {
        account: "team-a",
        project: None,
        job: Some("1"),
        node: "n1",
        model: GpuModel::H100Sxm,
        hour: 0,
        secs: 3600,
        mfu_bp: None,
    });
    hour.hour_start = march.start + 2 * 3600;
    let input = BillingInput {
        usage: vec![hour],
        idle: vec![IdleHour {
            node: NodeId::new("n1").unwrap(),
            gpu_model: GpuModel::H100Sxm,
            hour_start: march.start,
            gpu_seconds: 7200,
            quarter_seconds: None,
        }],
        ..BillingInput::default()
    };
    let inv = charge(&march, &input, &book, None).unwrap();
    assert_eq!(total_of(&inv, "team-a"), dec!(10.00));
    assert_eq!(total_of(&inv, "platform"), dec!(20.00));
    assert!(inv
        .iter()
        .flat_map(|i| &i.lines)
        .all(|l| l.key.price_book_version == "v1"));
}

#[test]
fn an_hour_that_straddles_two_bands_in_a_half_hour_zone_is_split_by_seconds() {
    // Kolkata is UTC+05:30: the UTC hour 14:00-15:00 is 19:30-20:30 local, half of it at night.
    let src = r#"[[versions]]
version = "v"
effective_from = "2026-05-01"
currency = "CNY"
time_zone = "Asia/Kolkata"
gpu_hour = { h100-sxm = "10.00" }
[[versions.time_of_use]]
name = "night"
hours = { from = 20, to = 8 }
multiplier = "0.50"
"#;
    let book = PriceBook::from_toml_str(src, "k.toml").unwrap();
    let input = BillingInput {
        usage: busy("team-a", "a1", 1, 14..15),
        ..BillingInput::default()
    };
    let inv = charge(&june(), &input, &book, None).unwrap();
    let by_band: Vec<(String, i64, Decimal)> = inv[0]
        .lines
        .iter()
        .map(|l| (l.key.band.clone(), l.gpu_seconds, l.amount))
        .collect();
    assert_eq!(
        by_band,
        vec![
            ("night".into(), 1800, dec!(2.50)),
            ("standard".into(), 1800, dec!(5.00))
        ]
    );
}

#[test]
fn late_data_makes_a_new_revision_with_correction_lines() {
    let input = BillingInput {
        usage: busy("team-a", "a1", 8, 0..10),
        ..BillingInput::default()
    };
    let r1 = revise(
        None,
        charge(&june(), &input, &book(""), None).unwrap().remove(0),
    );
    assert_eq!(r1.invoice_id, "INV-2026-06-team-a-r1");
    // Unchanged data: the same invoice, the same bytes.
    let again = revise(
        Some(r1.clone()),
        charge(&june(), &input, &book(""), None).unwrap().remove(0),
    );
    assert_eq!(invoice_csv(&again), invoice_csv(&r1));

    let mut late = input.clone();
    late.usage.extend(busy("team-a", "a1", 8, 10..12));
    let fresh = charge(&june(), &late, &book(""), None).unwrap().remove(0);
    let r2 = revise(Some(r1.clone()), fresh.clone());
    assert_eq!(r2.invoice_id, "INV-2026-06-team-a-r2");
    assert_eq!(&r2.lines[..r1.lines.len()], &r1.lines[..]);
    let correction = r2.lines.last().unwrap();
    assert!(correction.correction);
    assert_eq!(correction.revision, 2);
    assert_eq!(correction.gpu_seconds, 8 * 2 * 3600);
    assert_eq!(correction.amount, dec!(160.00));
    assert_eq!(r2.total(), fresh.total());
}

#[test]
fn missing_price_and_bad_month_are_errors() {
    let input = BillingInput {
        usage: vec![usage(Use {
            account: "a",
            project: None,
            job: None,
            node: "n1",
            model: GpuModel::H200,
            hour: 0,
            secs: 10,
            mfu_bp: None,
        })],
        ..BillingInput::default()
    };
    assert_eq!(
        charge(&june(), &input, &book(""), None)
            .unwrap_err()
            .to_string(),
        "price book `2026-06` has no GPU-hour price for `h200`"
    );
    assert!(Period::month("2026-13").is_err());
    assert!(Period::month("2026-6").is_err());
}

#[test]
fn the_focus_file_has_every_mandatory_column_and_exact_costs() {
    let mut u = busy("team-a", "a1", 3, 0..30);
    u.extend(busy("team-a", "a2", 1, 5..7));
    u.extend(busy("team-b", "b1", 5, 100..130));
    let input = BillingInput {
        usage: u,
        reservations: vec![reservation(Vec::new())],
        ..BillingInput::default()
    };
    let invoices = charge(&june(), &input, &book(NIGHT_BAND), None).unwrap();
    let focus = focus_csv(&invoices, "gpuledger");
    let mut lines = focus.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    for column in FOCUS_MANDATORY {
        assert!(
            header.contains(&column),
            "missing mandatory column {column}"
        );
    }
    for column in &header {
        let known = FOCUS_MANDATORY.contains(column)
            || column.starts_with("x_")
            || gpuledger_billing::render::FOCUS_OPTIONAL.contains(column);
        assert!(known, "{column}");
    }
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let mut billed = Decimal::ZERO;
    let mut rows = 0;
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let d = |name: &str| f[col(name)].parse::<Decimal>().unwrap();
        assert_eq!(
            d("PricingQuantity") * d("ListUnitPrice"),
            d("ListCost"),
            "{line}"
        );
        assert_eq!(
            d("PricingQuantity") * d("ContractedUnitPrice"),
            d("ContractedCost"),
            "{line}"
        );
        assert!(
            (d("ContractedCost") - d("BilledCost")).abs() <= dec!(0.01),
            "{line}"
        );
        for m in FOCUS_MANDATORY {
            if m != "ChargeClass" {
                assert!(!f[col(m)].is_empty(), "{m} empty in {line}");
            }
        }
        billed += d("BilledCost");
        rows += 1;
    }
    assert_eq!(billed, invoices.iter().map(Invoice::total).sum::<Decimal>());
    assert!(rows >= 4);
}

/// The FOCUS rows of `invoices` whose ChargeDescription mentions `charge`: each as a map of
/// column to value.
fn focus_rows(
    invoices: &[Invoice],
    charge: &str,
) -> Vec<std::collections::BTreeMap<String, String>> {
    let focus = focus_csv(invoices, "gpuledger");
    let mut lines = focus.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    lines
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(str::to_owned))
                .collect()
        })
        .filter(|r: &std::collections::BTreeMap<String, String>| {
            r["ChargeDescription"].contains(charge)
        })
        .collect()
}

#[test]
fn idle_capacity_rows_carry_their_quantity_and_costs_in_focus() {
    // 2 idle GPU-hours of an H100 at 10.00: 20.00 on the platform's invoice, or shared 1:2.
    let mut u = busy("team-a", "a1", 1, 0..1);
    u.extend(busy("team-b", "b1", 2, 0..1));
    let input = BillingInput {
        usage: u,
        idle: vec![IdleHour {
            node: NodeId::new("n001").unwrap(),
            gpu_model: GpuModel::H100Sxm,
            hour_start: JUNE,
            gpu_seconds: 7200,
            quarter_seconds: None,
        }],
        ..BillingInput::default()
    };
    for (policy, charge_type) in [("platform", "idle_capacity"), ("shared", "idle_share")] {
        let book = book(&format!("[versions.idle]\npolicy = \"{policy}\"\n"));
        let invoices = charge(&june(), &input, &book, None).unwrap();
        let rows = focus_rows(&invoices, charge_type);
        assert!(!rows.is_empty(), "{policy}");
        let sum = |column: &str| -> Decimal {
            rows.iter()
                .map(|r| r[column].parse::<Decimal>().unwrap())
                .sum()
        };
        assert_eq!(sum("PricingQuantity"), dec!(2), "{policy}: GPU-hours");
        assert_eq!(sum("ListCost"), dec!(20), "{policy}");
        assert_eq!(sum("ContractedCost"), dec!(20), "{policy}");
        assert_eq!(sum("BilledCost"), dec!(20.00), "{policy}");
        for r in &rows {
            let d = |c: &str| r[c].parse::<Decimal>().unwrap();
            assert_eq!(
                d("PricingQuantity") * d("ListUnitPrice"),
                d("ListCost"),
                "{r:?}"
            );
            assert!(
                (d("ContractedCost") - d("BilledCost")).abs() <= dec!(0.01),
                "{r:?}"
            );
        }
    }
}

#[test]
fn rendered_invoice_matches_its_golden_files() {
    let mut u = busy("team-a", "a1", 3, 18..26);
    u.extend(busy("team-a", "a2", 1, 5..7));
    let mut b = busy("team-b", "b1", 2, 9..11);
    b[0].mfu_bp = Some(4200);
    u.extend(b);
    let input = BillingInput {
        usage: u,
        ..BillingInput::default()
    };
    let models =
        format!("{NIGHT_BAND}\n[versions.models]\naccounts = {{ team-b = \"mfu_weighted\" }}\n");
    let invoices = charge(&june(), &input, &book(&models), None).unwrap();
    assert_eq!(total_of(&invoices, "team-b"), dec!(28.40)); // 2 h x 0.42 + 2 h unmeasured, x 10
    insta::assert_snapshot!("invoice_csv", invoice_csv(&invoices[0]));
    insta::assert_snapshot!("focus_csv", focus_csv(&invoices, "gpuledger"));
    let html = invoice_html(&invoices[0]);
    assert!(
        html.contains("<td class=\"n\" id=\"total\">160.00</td>"),
        "{html}"
    );
    assert!(html.contains("<svg"));
}

proptest! {
    #[test]
    fn largest_remainder_splits_sum_exactly_and_stay_within_one(
        total in 0i128..1_000_000_000,
        weights in proptest::collection::vec(0i128..1_000_000, 1..20),
    ) {
        let parts = split_largest_remainder(total, &weights);
        prop_assert_eq!(parts.iter().sum::<i128>(), total);
        let sum: i128 = weights.iter().sum();
        for (p, w) in parts.iter().zip(&weights) {
            if sum > 0 {
                let floor = total * w / sum;
                prop_assert!(*p == floor || *p == floor + 1, "{} vs {}", p, floor);
            }
        }
    }

    #[test]
    fn lines_sum_to_totals_and_seconds_are_conserved(
        rows in proptest::collection::vec((0usize..3, 0usize..3, 0usize..4, 0i64..720, 1i64..30_000, proptest::option::of(0u32..10_000)), 1..80),
        mfu_model in any::<bool>(),
    ) {
        let accounts = ["a", "b", "c"];
        let projects = [None, Some("p1"), Some("p2")];
        let jobs = ["j1", "j2", "j3", "j4"];
        let usage: Vec<UsageHour> = rows.iter().map(|(a, p, j, h, s, m)| usage(Use {
            account: accounts[*a], project: projects[*p], job: Some(jobs[*j]), node: "n001",
            model: GpuModel::H100Sxm, hour: *h, secs: *s, mfu_bp: *m,
        })).collect();
        let input = BillingInput { usage: usage.clone(), ..BillingInput::default() };
        let extra = format!("{NIGHT_BAND}\n[versions.models]\ndefault = \"{}\"\n", if mfu_model { "mfu_weighted" } else { "gpu_hours" });
        let book = book(&extra);
        let invoices = charge(&june(), &input, &book, None).unwrap();
        let billed: i64 = invoices.iter().map(Invoice::gpu_seconds).sum();
        prop_assert_eq!(billed, usage.iter().map(|u| u.gpu_seconds).sum::<i64>());
        for inv in &invoices {
            prop_assert_eq!(inv.total(), inv.lines.iter().map(|l| l.amount).sum::<Decimal>());
            for l in &inv.lines {
                prop_assert_eq!(l.jobs.iter().map(|j| j.amount).sum::<Decimal>(), l.amount);
                prop_assert_eq!(l.jobs.iter().map(|j| j.gpu_seconds).sum::<i64>(), l.gpu_seconds);
                // Reference: the exact price of the line's usage, straight from the inputs,
                // divided once at the end.
                let numerator: Decimal = usage.iter()
                    .filter(|u| u.account == inv.account && u.project == l.key.project)
                    .filter(|u| {
                        let hour = (u.hour_start / 3600) % 24;
                        let night = !(8..20).contains(&hour);
                        (l.key.band == "off-peak-night") == night
                    })
                    .map(|u| {
                        let factor = if mfu_model {
                            u.mfu_bp.map(|bp| Decimal::new(bp.into(), 4).max(dec!(0.1))).unwrap_or(Decimal::ONE)
                        } else { Decimal::ONE };
                        Decimal::from(u.gpu_seconds) * factor * l.unit_price
                    })
                    .sum();
                let exact = numerator / dec!(3600);
                prop_assert!((l.amount - exact).abs() <= dec!(0.005), "{} vs {}", l.amount, exact);
            }
            // The same input gives the same bytes.
            let again = charge(&june(), &input, &book, None).unwrap();
            let twin = again.iter().find(|i| i.account == inv.account).unwrap();
            prop_assert_eq!(invoice_csv(twin), invoice_csv(inv));
        }
    }
}

/// Audit (d): the exporters' samples carry exact times, so an hour that a band cuts in a
/// half- or quarter-hour zone is cut where the seconds were used, not in proportion.
#[test]
fn a_band_cuts_an_hour_exactly_where_its_seconds_were_used() {
    // Kolkata (UTC+05:30), night from 22:00: 16:00-17:00 UTC is 21:30-22:30 local. Eight GPUs
    // busy 16:00-16:30 UTC only (21:30-22:00 local): all before the night band, 8 x 0.5 h x
    // 10.00 = 40.00 (in proportion it was 20.00 + 10.00 = 30.00).
    let kolkata = r#"[[versions]]
version = "v"
effective_from = "2026-05-01"
currency = "CNY"
time_zone = "Asia/Kolkata"
gpu_hour = { h100-sxm = "10.00" }
[[versions.time_of_use]]
name = "night"
hours = { from = 22, to = 6 }
multiplier = "0.50"
"#;
    let mut hour = usage(Use {
        account: "team-a",
        project: None,
        job: Some("1"),
        node: "n1",
        model: GpuModel::H100Sxm,
        hour: 16,
        secs: 8 * 1800,
        mfu_bp: None,
    });
    hour.quarter_seconds = Some([8 * 900, 8 * 900, 0, 0]);
    let book = PriceBook::from_toml_str(kolkata, "k.toml").unwrap();
    let input = BillingInput {
        usage: vec![hour.clone()],
        ..BillingInput::default()
    };
    let inv = charge(&june(), &input, &book, None).unwrap();
    assert_eq!(total_of(&inv, "team-a"), dec!(40.00));
    assert!(inv[0].lines.iter().all(|l| l.key.band == "standard"));
    // Kathmandu (UTC+05:45): 16:00 UTC is 21:45 local; the first quarter alone is before 22:00.
    let book =
        PriceBook::from_toml_str(&kolkata.replace("Asia/Kolkata", "Asia/Kathmandu"), "n.toml")
            .unwrap();
    hour.quarter_seconds = Some([8 * 900, 8 * 900, 0, 0]);
    let inv = charge(
        &june(),
        &BillingInput {
            usage: vec![hour],
            ..BillingInput::default()
        },
        &book,
        None,
    )
    .unwrap();
    // 7200 s standard = 20.00, 7200 s night = 10.00.
    assert_eq!(total_of(&inv, "team-a"), dec!(30.00));
}

/// Every band second, in zones off UTC by whole, half and quarter hours and across both DST
/// changes (Lord Howe's is half an hour), lands in the band its local time is in: the engine
/// against a reference that looks at each minute.
#[test]
fn bands_cut_exactly_in_every_zone_and_across_both_dst_changes() {
    use chrono::{TimeZone, Timelike};
    // (zone, a day with a change of offset or none)
    let cases = [
        ("Asia/Kolkata", "2026-06-10"),
        ("Asia/Kathmandu", "2026-06-10"),
        ("America/New_York", "2026-03-08"),
        ("America/New_York", "2026-11-01"),
        ("Australia/Lord_Howe", "2026-04-05"),
        ("Australia/Lord_Howe", "2026-10-04"),
        ("Europe/Berlin", "2026-03-29"),
    ];
    // Busy in the first and third quarter of every hour.
    let pattern = [900i64, 0, 900, 0];
    for (zone, day) in cases {
        let tz: chrono_tz::Tz = zone.parse().unwrap();
        let date = chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d").unwrap();
        let period = Period::month(&date.format("%Y-%m").to_string()).unwrap();
        let start = date.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp() - 86_400;
        let src = format!(
            "[[versions]]\nversion = \"v\"\neffective_from = \"2026-01-01\"\ncurrency = \"CNY\"\n\
             time_zone = \"{zone}\"\ngpu_hour = {{ h100-sxm = \"10.00\" }}\n\
             [[versions.time_of_use]]\nname = \"night\"\nhours = {{ from = 22, to = 6 }}\nmultiplier = \"0.50\"\n"
        );
        let book = PriceBook::from_toml_str(&src, "z.toml").unwrap();
        let mut input = BillingInput::default();
        let mut want_night = 0;
        for h in 0..72 {
            let hour_start = start + h * 3600;
            if hour_start < period.start || hour_start >= period.end {
                continue;
            }
            let mut u = usage(Use {
                account: "team-a",
                project: None,
                job: Some("1"),
                node: "n1",
                model: GpuModel::H100Sxm,
                hour: 0,
                secs: 1800,
                mfu_bp: None,
            });
            u.hour_start = hour_start;
            u.quarter_seconds = Some(pattern);
            input.usage.push(u);
            for minute in 0..60 {
                if pattern[minute / 15] == 0 {
                    continue;
                }
                let t = hour_start + minute as i64 * 60;
                let local = tz.from_utc_datetime(
                    &chrono::DateTime::from_timestamp(t, 0).unwrap().naive_utc(),
                );
                if local.hour() >= 22 || local.hour() < 6 {
                    want_night += 60;
                }
            }
        }
        let inv = charge(&period, &input, &book, None).unwrap();
        let night: i64 = inv[0]
            .lines
            .iter()
            .filter(|l| l.key.band == "night")
            .map(|l| l.gpu_seconds)
            .sum();
        assert_eq!(night, want_night, "{zone} {day}");
    }
}

/// A coverage gap (held by the job's events, not measured) is billed under `coverage =
/// "allocation"` and not under `"telemetry"`; the invoice lists it either way.
#[test]
fn a_coverage_gap_is_billed_as_the_price_book_says_and_noted_either_way() {
    let measured = usage(Use {
        account: "team-a",
        project: None,
        job: Some("7"),
        node: "n1",
        model: GpuModel::H100Sxm,
        hour: 3,
        secs: 3600,
        mfu_bp: None,
    });
    let mut gap = measured.clone();
    gap.node = NodeId::new("n2").unwrap();
    let input = BillingInput {
        usage: vec![measured],
        gaps: vec![gap],
        ..BillingInput::default()
    };
    for (coverage, total, billed) in [
        ("allocation", dec!(20.00), 3600),
        ("telemetry", dec!(10.00), 0),
    ] {
        let inv = charge(
            &june(),
            &input,
            &book(&format!("coverage = \"{coverage}\"")),
            None,
        )
        .unwrap();
        assert_eq!(total_of(&inv, "team-a"), total, "{coverage}");
        assert_eq!(
            inv[0].notes.coverage_gaps,
            [gpuledger_billing::GapNote {
                job_id: Some(JobId::new("7").unwrap()),
                node: NodeId::new("n2").unwrap(),
                gpu_seconds: 3600,
                billed_gpu_seconds: billed,
            }],
            "{coverage}"
        );
        let html = invoice_html(&inv[0]);
        assert!(html.contains("id=\"coverage-gaps\""), "{coverage}");
    }
}
