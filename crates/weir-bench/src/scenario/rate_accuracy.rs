//! `rate-accuracy`: how exactly Weir holds many different rates at once — nine token buckets
//! from 10 to 5000 a second, each offered three times its rate, admitted against configured.

use serde::Serialize;

use super::{Scenario, ScenarioSettings, finish, median, one_run};
use crate::run::{self, TargetSpec};
use weir_server::ConfigFile;

/// The configured rates `rate-accuracy` runs side by side, per second.
pub const ACCURACY_RATES: [u32; 9] = [10, 25, 50, 100, 250, 500, 1000, 2500, 5000];

/// How many times its rate each bucket is offered.
const OVERLOAD: f64 = 3.0;

/// One bucket's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AccuracyRow {
    /// The policy (one per rate).
    pub policy: String,
    /// Its configured rate, per second.
    pub configured: f64,
    /// The rate the generator managed to send, per second (short of the offer: it missed);
    /// the median over the runs.
    pub sent: f64,
    /// Its admitted rate over the measured time, per second; the median over the runs.
    pub admitted: f64,
    /// `admitted / configured`.
    pub ratio: f64,
    /// The longest time, over the runs, from the start of the measured time to the last
    /// answer, in seconds (a run's `span`): on a loaded machine the last requests go out late
    /// and the bucket refills for longer than `seconds`, which bounds what it may admit.
    pub span: f64,
}

/// `rate-accuracy`'s report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RateAccuracy {
    /// Measured seconds, per run.
    pub seconds: f64,
    /// How many times the nine buckets ran.
    pub runs: usize,
    /// One row per rate.
    pub rows: Vec<AccuracyRow>,
    /// The largest `|ratio - 1|`.
    pub worst_deviation: f64,
}

impl RateAccuracy {
    /// The report as a table.
    pub fn render(&self) -> String {
        let mut text = format!(
            "rate accuracy over {:.1}s (median of {} run(s)), each bucket offered {OVERLOAD}× its rate\n{:>12} {:>12} {:>12} {:>12} {:>8}\n",
            self.seconds, self.runs, "policy", "configured", "sent", "admitted", "ratio"
        );
        for row in &self.rows {
            text.push_str(&format!(
                "{:>12} {:>12.1} {:>12.1} {:>12.1} {:>8.4}\n",
                row.policy, row.configured, row.sent, row.admitted, row.ratio
            ));
        }
        text.push_str(&format!(
            "worst deviation: {:.2}%\n",
            self.worst_deviation * 100.0
        ));
        text
    }
}

/// The policies `rate-accuracy` runs: one token bucket per rate, refusing, with a burst of a
/// tenth of a second's worth (at least 2). A burst of 1 would measure the generator's jitter
/// instead: a request a hair early for its slot is refused and the next one comes a third of
/// an interval later, a loss of rate `docs/benchmarks.md` ("`weir bench scenario
/// rate-accuracy`") measured.
fn accuracy_config() -> ConfigFile {
    let mut toml = String::new();
    for rate in ACCURACY_RATES {
        let burst = (rate / 10).max(2);
        toml.push_str(&format!(
            "[[policy]]\nname = \"rate-{rate}\"\non_exhausted = \"reject\"\ntoken_bucket = {{ rate = {rate}, burst = {burst} }}\n\n"
        ));
    }
    ConfigFile::parse(&toml).expect("the scenario's own config is valid")
}

/// Offers each of [`ACCURACY_RATES`] three times its rate, in process, all at once, and
/// compares what was admitted with what was configured; `settings.runs` times, the median.
pub async fn rate_accuracy(settings: &ScenarioSettings) -> anyhow::Result<RateAccuracy> {
    let config = accuracy_config();
    let runs = settings.runs.max(1);
    let mut sent = vec![Vec::with_capacity(runs); ACCURACY_RATES.len()];
    let mut admitted = vec![Vec::with_capacity(runs); ACCURACY_RATES.len()];
    let mut spans = vec![0.0_f64; ACCURACY_RATES.len()];
    for _ in 0..runs {
        for (i, (rate, report)) in one_round(&config, settings).await?.into_iter().enumerate() {
            if let Some(error) = report.first_error {
                anyhow::bail!("rate-{rate}: {error}");
            }
            sent[i].push(report.rps);
            admitted[i].push(report.admitted as f64 / report.seconds);
            spans[i] = spans[i].max(report.span);
        }
    }
    let rows: Vec<AccuracyRow> = ACCURACY_RATES
        .into_iter()
        .zip(sent.into_iter().zip(admitted).zip(spans))
        .map(|(rate, ((sent, admitted), span))| {
            let configured = f64::from(rate);
            let admitted = median(admitted);
            AccuracyRow {
                policy: format!("rate-{rate}"),
                configured,
                sent: median(sent),
                admitted,
                ratio: admitted / configured,
                span,
            }
        })
        .collect();
    let worst_deviation = rows
        .iter()
        .map(|row| (row.ratio - 1.0).abs())
        .fold(0.0, f64::max);
    Ok(RateAccuracy {
        seconds: settings.duration.as_secs_f64(),
        runs,
        rows,
        worst_deviation,
    })
}

/// The nine buckets side by side once: each rate with its run's report.
async fn one_round(
    config: &ConfigFile,
    settings: &ScenarioSettings,
) -> anyhow::Result<Vec<(u32, crate::report::Report)>> {
    let clients = 4;
    let handles = ACCURACY_RATES.map(|rate| {
        let mut one = one_run(
            TargetSpec::InProcess(Box::new(config.clone())),
            &format!("rate-{rate}"),
            f64::from(rate) * OVERLOAD / clients as f64,
            settings,
        );
        one.clients = clients;
        one.configured = Some(f64::from(rate));
        tokio::spawn(async move { run::run(&one).await })
    });
    let mut reports = Vec::with_capacity(handles.len());
    for (rate, handle) in ACCURACY_RATES.into_iter().zip(handles) {
        reports.push((rate, handle.await??));
    }
    Ok(reports)
}

/// This scenario, as `weir bench scenario` lists it.
pub const SCENARIO: Scenario = Scenario {
    name: "rate-accuracy",
    aliases: &[],
    measures: "many buckets at different rates, admitted against configured",
    figures: "docs/benchmarks.md, `weir bench scenario rate-accuracy`",
    plots: false,
    upgrades: false,
    run: |settings, _plot| finish(rate_accuracy(settings), RateAccuracy::render),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenario_config_has_one_policy_per_rate() {
        let config = accuracy_config();
        let names: Vec<&str> = config.policy.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names.len(), ACCURACY_RATES.len());
        assert_eq!(names[0], "rate-10");
        assert_eq!(names[8], "rate-5000");
    }

    #[test]
    fn the_table_shows_every_row_and_the_worst_deviation() {
        let report = RateAccuracy {
            seconds: 10.0,
            runs: 3,
            rows: vec![AccuracyRow {
                policy: "rate-10".to_owned(),
                configured: 10.0,
                sent: 30.0,
                admitted: 9.9,
                ratio: 0.99,
                span: 10.0,
            }],
            worst_deviation: 0.01,
        };
        let text = report.render();
        assert!(text.contains("(median of 3 run(s))"), "{text}");
        assert!(
            text.contains("rate-10         10.0         30.0          9.9   0.9900"),
            "{text}"
        );
        assert!(text.ends_with("worst deviation: 1.00%\n"), "{text}");
    }
}
