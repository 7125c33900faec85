//! Small statistics shared by the simulator's report and the aggregator's indicators, so both
//! state a percentile the same way.

/// Nearest-rank percentile (`p` in 0-100) of sorted values: the smallest value with at least
/// `p`% of the values at or below it. `None` for no values.
pub fn percentile(sorted: &[i64], p: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank() {
        let v = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100];
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 95.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(10));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
