//! The spool on a disk that fills up (a real 64 KiB tmpfs, mounted for the test; needs root,
//! as the test command runs): the newest batches are kept by dropping the oldest, each drop is
//! counted, and a batch that cannot fit even alone is lost, counted and reported as an error,
//! while the spool keeps working.

use gpuledger_exporter::spool::Spool;
use gpuledger_testkit::Tmpfs;

#[test]
fn a_full_disk_keeps_the_newest_batches_and_counts_the_loss() {
    let disk = Tmpfs::mount("64k");
    let mut spool = Spool::open(disk.path(), 1 << 30).unwrap();
    let batch = |n: u8| vec![n; 12 * 1024];
    let mut kept = Vec::new();
    for n in 0..20u8 {
        let seq = spool
            .push(&batch(n))
            .expect("a batch that fits alone is always spooled");
        kept.push((seq, n));
    }
    assert!(
        spool.dropped() > 0,
        "the disk filled: the oldest were dropped"
    );
    assert_eq!(spool.lost(), 0);
    assert!(
        spool.len() >= 2 && spool.len() < 20,
        "{} batches kept",
        spool.len()
    );
    // What is kept is the newest, in order, and it reads back.
    // (A number whose write failed on the full disk is never given again: numbers may skip.)
    let (oldest, bytes) = spool.oldest().unwrap().unwrap();
    let (seq, n) = kept[20 - spool.len()];
    assert_eq!(oldest, seq);
    assert!(
        bytes == batch(n),
        "batch {seq} reads back as it was spooled"
    );
    // Larger than the whole disk: lost, counted, and the spool goes on.
    let err = spool.push(&vec![0u8; 128 * 1024]).unwrap_err();
    assert!(err.is_disk_full(), "{err}");
    assert_eq!(spool.lost(), 1);
    assert!(spool.is_empty(), "everything older was given up for it");
    let next = spool.push(&batch(99)).unwrap();
    assert!(next > kept[19].0 + 1, "numbers are never reused");
    assert!(spool.oldest().unwrap().unwrap().1 == batch(99));
    // No half-written file is left behind.
    let stray: Vec<_> = std::fs::read_dir(disk.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}
