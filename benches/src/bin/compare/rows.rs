//! The rows of the table, their targets, and the table's Markdown.

use std::fmt::Write as _;

use loadgate_benches::harness::Series;

use crate::Case;

// ---------------------------------------------------------------------------
// Rows and targets.

/// What the issue asks of a comparison.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// No target: shown for information.
    None,
    /// loadgate's p50 at least this many times lower than the design's.
    Faster(f64),
    /// loadgate's p50 at most this many times the floor's.
    WithinOf(f64),
    /// loadgate's p50 at least this many times lower than the design's, or
    /// close enough to the case's floor (its [`Target::Floor`] design).
    FasterOrFloor(f64),
    /// The case's floor: loadgate's p50 at most this many times the
    /// floor's meets every `FasterOrFloor` target of the case. Judged
    /// through those rows, not on its own.
    Floor(f64),
    /// loadgate's throughput at least this many times the design's.
    Throughput(f64),
    /// loadgate's p50 at most this many nanoseconds, whatever the design's.
    Under(f64),
}

pub(crate) struct Compared {
    pub(crate) design: &'static str,
    pub(crate) series: Series,
    pub(crate) target: Target,
}

pub(crate) struct Row {
    pub(crate) case: Case,
    pub(crate) loadgate: Series,
    pub(crate) others: Vec<Compared>,
}

/// loadgate's p50 over the floor's.
pub(crate) fn floor_ratio(lg: &Series, floor: &Series) -> f64 {
    lg.p50() / floor.p50().max(1e-3)
}

impl Compared {
    /// The ratio shown, and whether the target was met. `floor` is the
    /// case's [`Target::Floor`] design and its bound, if it has one.
    fn ratio(
        &self,
        lg: &Series,
        throughput: bool,
        floor: Option<(&Series, f64)>,
    ) -> (String, Option<bool>) {
        let faster = self.series.p50() / lg.p50().max(1e-3);
        match self.target {
            Target::WithinOf(x) => {
                let r = floor_ratio(lg, &self.series);
                (format!("{r:.2}× floor"), Some(r <= x))
            }
            Target::Floor(_) => {
                let r = floor_ratio(lg, &self.series);
                (format!("{r:.2}× floor"), None)
            }
            Target::FasterOrFloor(x) => match floor {
                Some((f, bound)) => {
                    let r = floor_ratio(lg, f);
                    (
                        format!("{faster:.2}× faster, {r:.2}× floor"),
                        Some(faster >= x || r <= bound),
                    )
                }
                None => (format!("{faster:.2}× faster"), Some(faster >= x)),
            },
            Target::Throughput(x) => {
                let r = lg.throughput() / self.series.throughput().max(1e-9);
                (format!("{r:.2}× throughput"), Some(r >= x))
            }
            Target::Faster(x) => (format!("{faster:.2}× faster"), Some(faster >= x)),
            Target::Under(x) => (format!("{faster:.2}× faster"), Some(lg.p50() <= x)),
            Target::None if throughput => {
                let r = lg.throughput() / self.series.throughput().max(1e-9);
                (format!("{r:.2}× throughput"), None)
            }
            Target::None => (format!("{faster:.2}× faster"), None),
        }
    }

    fn target_text(&self, floor: Option<(&Series, f64)>) -> String {
        match self.target {
            Target::None => "—".into(),
            Target::Faster(x) => format!("≥ {x}× faster"),
            Target::FasterOrFloor(x) => match floor {
                Some((_, bound)) => format!("≥ {x}× faster or ≤ {bound}× floor"),
                None => format!("≥ {x}× faster"),
            },
            Target::WithinOf(x) => format!("≤ {x}× floor"),
            Target::Floor(x) => format!("≤ {x}× floor meets the rows above"),
            Target::Throughput(x) => format!("≥ {x}× throughput"),
            Target::Under(x) => format!("loadgate ≤ {}", ns(x)),
        }
    }
}

pub(crate) fn ns(v: f64) -> String {
    if v >= 100_000.0 {
        format!("{:.0} µs", v / 1000.0)
    } else if v >= 10_000.0 {
        format!("{:.1} µs", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} ns")
    } else {
        format!("{v:.1} ns")
    }
}

pub(crate) fn allocs(s: &Series) -> String {
    let a = s.allocs_per_op();
    if s.allocs == 0 {
        "0".into()
    } else if a >= 0.1 {
        format!("{a:.1}")
    } else {
        format!("{} in {}", s.allocs, s.ops)
    }
}

pub(crate) fn latency_cells(s: &Series, throughput: bool) -> (String, String) {
    if throughput {
        let on_cpu = s
            .threads_on_cpu()
            .map_or(String::new(), |t| format!(", {t:.1} threads on CPU"));
        let rate = s.throughput();
        let rate = if rate >= 1e6 {
            format!("{:.1} M/s", rate / 1e6)
        } else {
            format!("{:.0} k/s", rate / 1e3)
        };
        let p99 = if s.per_op {
            format!("{} (p99.9 {})", ns(s.p99()), ns(s.p999()))
        } else {
            ns(s.p99())
        };
        (format!("{} ({rate}{on_cpu})", ns(s.p50())), p99)
    } else {
        (ns(s.p50()), ns(s.p99()))
    }
}

// ---------------------------------------------------------------------------
// Output.

pub(crate) fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    format!("{model}, {cpus} CPUs, load average {load} at start")
}

/// The Markdown table, with the targets met, the targets set and the hot
/// paths that allocated.
pub(crate) fn table(rows: &[Row]) -> (String, usize, usize, Vec<String>) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| case | design | p50 | p99 | allocs/op | loadgate vs design | target | met |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---|:---:|");
    let (mut met, mut total) = (0, 0);
    let mut alloc_failures = Vec::new();
    for row in rows {
        let throughput = row.case.throughput;
        let (p50, p99) = latency_cells(&row.loadgate, throughput);
        let _ = writeln!(
            out,
            "| {} | **loadgate** | **{p50}** | **{p99}** | {} | | | |",
            row.case.name,
            allocs(&row.loadgate)
        );
        if row.case.hot && row.loadgate.allocs > 0 {
            alloc_failures.push(format!(
                "{}: {} allocations in {} ops",
                row.case.name, row.loadgate.allocs, row.loadgate.ops
            ));
        }
        let floor = row.others.iter().find_map(|o| match o.target {
            Target::Floor(bound) => Some((&o.series, bound)),
            _ => None,
        });
        for o in &row.others {
            let (p50, p99) = latency_cells(&o.series, throughput);
            let (ratio, ok) = o.ratio(&row.loadgate, throughput, floor);
            let mark = match ok {
                Some(true) => {
                    met += 1;
                    total += 1;
                    "yes"
                }
                Some(false) => {
                    total += 1;
                    "**no**"
                }
                None => "",
            };
            let _ = writeln!(
                out,
                "| | {} | {p50} | {p99} | {} | {ratio} | {} | {mark} |",
                o.design,
                allocs(&o.series),
                o.target_text(floor)
            );
        }
    }
    (out, met, total, alloc_failures)
}

/// The markers around the generated block of a Markdown file; everything
/// outside them is kept as written.
pub(crate) const BEGIN: &str = "<!-- compare: begin -->";
pub(crate) const END: &str = "<!-- compare: end -->";

/// The file at `path` and where its generated block's contents start and
/// end.
pub(crate) fn read_block(path: &str) -> Result<(String, usize, usize), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
    match (text.find(BEGIN), text.find(END)) {
        (Some(begin), Some(end)) if begin < end => Ok((text, begin + BEGIN.len(), end)),
        _ => Err(format!(
            "{path} has no `{BEGIN}` ... `{END}` block for the table"
        )),
    }
}

/// Replaces the generated block of `path` with `block`.
pub(crate) fn write_block(path: &str, block: &str) -> Result<(), String> {
    let (text, start, end) = read_block(path)?;
    let updated = format!("{}\n{block}{}", &text[..start], &text[end..]);
    std::fs::write(path, updated).map_err(|e| format!("writing {path}: {e}"))
}
