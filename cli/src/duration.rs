//! Durations for people, as the comparison table and the chart's legend write them.

/// A duration for people: `0`, `750ns`, `12.5us`, `250ms`, `1.5s`, `10s`, `2m`, `1.5h`.
pub(crate) fn duration(ns: u64) -> String {
    const UNITS: [(u64, &str); 6] = [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    if ns == 0 {
        return "0".into();
    }
    let &(unit, name) = UNITS.iter().find(|&&(unit, _)| ns >= unit).unwrap_or(&UNITS[5]);
    if ns.is_multiple_of(unit) {
        return format!("{}{name}", ns / unit);
    }
    let value = ns as f64 / unit as f64;
    let text = if value < 10.0 { format!("{value:.2}") } else { format!("{value:.1}") };
    format!("{}{name}", text.trim_end_matches('0').trim_end_matches('.'))
}
