//! The scenario's report: per mode, the goals met or not, the demand changes followed, and the
//! first run's timeline side by side; as text and as an SVG.

use plotters::prelude::*;

use std::path::Path;

use super::{AdaptiveBackpressure, Second, change};
use crate::plot::{Drawn, Series, Timed, panel};

fn optional(value: Option<u64>) -> String {
    value.map_or("never".to_owned(), |v| format!("{v}s"))
}

impl AdaptiveBackpressure {
    /// The figures of every run, then the first run's timeline, both modes side by side.
    pub fn render(&self) -> String {
        let mut text = format!(
            "toy meta service taking {} calls/s; demand {}/s (hot 400, warm 150, 5 cold × 10); \
             steady {}s, then the hot table stops for {}s and comes back for {}s\n\
             goals: second half ≥ 90 % utilization with ≤ 2 % busy; no table limited below its \
             demand with ≥ 10 % spare for over 6s; a demand change followed within 10s\n\n",
            self.capacity,
            self.demand,
            self.mix.steady,
            change(self.mix.steady),
            change(self.mix.steady)
        );
        text.push_str(&format!(
            "{:>3} {:<10} {:>11} {:>6} {:>9} {:>8} {:>9} {:>9}  {}\n",
            "run",
            "control",
            "utilization",
            "busy",
            "converged",
            "starved",
            "hot stop",
            "hot back",
            "admitted/s of demand/s (second half)"
        ));
        for (i, pair) in self.runs.iter().enumerate() {
            for run in [&pair.stepwise, &pair.converging] {
                let follow = |n: usize| run.followed.get(n).and_then(|(_, f)| *f);
                let shares: Vec<String> = run
                    .shares
                    .iter()
                    .filter(|s| !s.table.starts_with("cold-") || s.table == "cold-1")
                    .map(|s| format!("{} {:.0}/{:.0}", s.table, s.admitted, s.demand))
                    .collect();
                text.push_str(&format!(
                    "{:>3} {:<10} {:>10.1}% {:>5.1}% {:>9} {:>7}s {:>9} {:>9}  {}{}\n",
                    i + 1,
                    run.control,
                    run.utilization * 100.0,
                    run.busy_share * 100.0,
                    optional(run.converged_at),
                    run.longest_starved,
                    optional(follow(0)),
                    optional(follow(1)),
                    shares.join(", "),
                    if run.cold_limited {
                        "; a cold table was limited"
                    } else {
                        ""
                    }
                ));
            }
        }
        text.push_str(&format!(
            "\nafter a transient (hot 200, warm 60, cold 10 against {}; the capacity halved for 1s at {}s): \
             seconds until no table is limited below its demand\n",
            self.capacity,
            self.transient.steady
        ));
        for (i, pair) in self.transients.iter().enumerate() {
            text.push_str(&format!(
                "{:>3} stepwise {:>6}, converging {:>6}\n",
                i + 1,
                optional(pair.stepwise.let_go),
                optional(pair.converging.let_go)
            ));
        }
        let Some(first) = self.runs.first() else {
            return text;
        };
        text.push_str(&format!(
            "\nrun 1, a row a second (accepted/busy; hot, warm, cold accepted; limits)\n{:>4}  {:<58}  {}\n",
            "t", "stepwise", "converging"
        ));
        for (a, b) in first
            .stepwise
            .timeline
            .iter()
            .zip(&first.converging.timeline)
        {
            text.push_str(&format!("{:>3}s  {:<58}  {}\n", a.at, row(a), row(b)));
        }
        text
    }

    /// Draws both modes of the first run into the SVG file `path`.
    pub fn plot(&self, path: &Path) -> anyhow::Result<()> {
        crate::plot::save(path, &self.svg()?)
    }

    /// Both modes of the first run as an SVG document: a panel each, calls a second over time.
    pub fn svg(&self) -> anyhow::Result<String> {
        crate::plot::render(|out| draw(out, self))
    }
}

pub(super) fn row(second: &Second) -> String {
    let table = |name: &str| second.accepted_per_table.get(name).copied().unwrap_or(0);
    let cold: u64 = second
        .accepted_per_table
        .iter()
        .filter(|(name, _)| name.starts_with("cold"))
        .map(|(_, n)| n)
        .sum();
    let limits: Vec<String> = second
        .limits
        .iter()
        .map(|(table, limit)| format!("{table}≤{limit:.0}"))
        .collect();
    format!(
        "{:>3}/{:<3} {:>3} {:>3} {:>3}  {}",
        second.accepted,
        second.busy,
        table("hot"),
        table("warm"),
        cold,
        if limits.is_empty() {
            "-".to_owned()
        } else {
            limits.join(" ")
        }
    )
}

impl Timed for Second {
    fn at(&self) -> f64 {
        self.at as f64
    }
}

fn draw(out: &mut String, report: &AdaptiveBackpressure) -> Drawn {
    const SIZE: (u32, u32) = (960, 720);
    let root = SVGBackend::with_string(out, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "weir bench scenario adaptive-backpressure: calls a second at the backend",
        ("sans-serif", 20),
    )?;
    let (upper, lower) = root.split_vertically(SIZE.1 / 2 - 20);
    let series: [Series<Second>; 6] = [
        ("capacity", |s| s.capacity as f64, BLACK),
        ("accepted", |s| s.accepted as f64, RGBColor(0, 140, 0)),
        ("busy", |s| s.busy as f64, RED),
        ("hot accepted", |s| table(s, "hot"), BLUE),
        ("warm accepted", |s| table(s, "warm"), RGBColor(230, 120, 0)),
        (
            "hot limit",
            |s| s.limits.get("hot").copied().unwrap_or(f64::NAN),
            MAGENTA,
        ),
    ];
    if let Some(first) = report.runs.first() {
        let top = first
            .stepwise
            .timeline
            .iter()
            .chain(&first.converging.timeline)
            .map(|s| s.arrived.max(s.capacity) as f64)
            .fold(1.0, f64::max)
            * 1.1;
        let y_desc = "calls a second";
        let stepwise = &first.stepwise.timeline;
        panel(&upper, Some("stepwise"), stepwise, y_desc, top, &series)?;
        let converging = &first.converging.timeline;
        panel(&lower, Some("converging"), converging, y_desc, top, &series)?;
    }
    root.present()?;
    Ok(())
}

fn table(second: &Second, name: &str) -> f64 {
    second.accepted_per_table.get(name).copied().unwrap_or(0) as f64
}
