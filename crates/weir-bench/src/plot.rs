//! `--plot FILE.svg`: a run's timeline as a chart — latency percentiles above, admitted and
//! refused rates below, a point a second — because a chart is read faster than a table.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::report::Point;

/// The chart's size in pixels.
const SIZE: (u32, u32) = (960, 640);

/// Draws `timeline` as an SVG document titled `title`.
pub fn svg(title: &str, timeline: &[Point]) -> anyhow::Result<String> {
    render(|out| draw(out, title, timeline))
}

/// Draws `timeline` into the SVG file `path`.
pub fn write(path: &Path, title: &str, timeline: &[Point]) -> anyhow::Result<()> {
    save(path, &svg(title, timeline)?)
}

/// What drawing with plotters answers.
pub(crate) type Drawn = Result<(), Box<dyn std::error::Error>>;

/// An SVG document, drawn by `draw` into the string it is given.
pub(crate) fn render(draw: impl FnOnce(&mut String) -> Drawn) -> anyhow::Result<String> {
    let mut text = String::new();
    draw(&mut text).map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    Ok(text)
}

/// Writes the SVG document `text` to `path`.
pub(crate) fn save(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing the plot {}", path.display()))
}

/// A point of a timeline a panel draws: when it is, in seconds from the start.
pub(crate) trait Timed {
    /// Seconds from the start.
    fn at(&self) -> f64;
}

impl Timed for Point {
    fn at(&self) -> f64 {
        self.at
    }
}

/// A line on a panel: its legend, its value at a point (not drawn where not finite), its colour.
pub(crate) type Series<T> = (&'static str, fn(&T) -> f64, RGBColor);

fn draw(out: &mut String, title: &str, timeline: &[Point]) -> Drawn {
    let root = SVGBackend::with_string(out, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let (upper, lower) = root.split_vertically(SIZE.1 / 2 - 20);
    let slowest = timeline.iter().map(|p| p.p99).fold(0.0, f64::max);
    panel(
        &upper,
        None,
        timeline,
        "latency, ms",
        (slowest * 1.1).max(0.001),
        &[("p50", |p| p.p50, BLUE), ("p99", |p| p.p99, RED)],
    )?;
    let busiest = timeline
        .iter()
        .map(|p| p.rps.max(p.admitted + p.refused))
        .fold(0.0, f64::max);
    panel(
        &lower,
        None,
        timeline,
        "requests per second",
        (busiest * 1.1).max(1.0),
        &[
            ("sent", |p| p.rps, BLACK),
            ("admitted", |p| p.admitted, RGBColor(0, 140, 0)),
            ("refused", |p| p.refused, RGBColor(230, 120, 0)),
            ("missed", |p| p.missed, MAGENTA),
        ],
    )?;
    root.present()?;
    Ok(())
}

/// One chart, captioned `caption` if given: `series` over the timeline's seconds, the y axis
/// from 0 to `top`.
pub(crate) fn panel<T: Timed>(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: Option<&str>,
    timeline: &[T],
    y_desc: &str,
    top: f64,
    series: &[Series<T>],
) -> Drawn {
    let end = timeline.last().map_or(1.0, Timed::at).max(1.0);
    let mut builder = ChartBuilder::on(area);
    if let Some(caption) = caption {
        builder.caption(caption, ("sans-serif", 16));
    }
    let mut chart = builder
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..end, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(y_desc)
        .draw()?;
    for &(name, value, color) in series {
        chart
            .draw_series(LineSeries::new(
                timeline
                    .iter()
                    .map(|p| (p.at(), value(p)))
                    .filter(|(_, v)| v.is_finite()),
                color,
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(at: f64, p99: f64) -> Point {
        Point {
            at,
            rps: 300.0,
            admitted: 100.0,
            refused: 200.0,
            missed: 0.0,
            p50: p99 / 2.0,
            p99,
        }
    }

    #[test]
    fn a_chart_has_both_panels_their_series_and_a_line_per_series() {
        let timeline: Vec<Point> = (1..=5).map(|s| point(f64::from(s), 2.0)).collect();
        let text = svg("weir bench: inproc", &timeline).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..80]);
        for label in [
            "weir bench: inproc",
            "latency, ms",
            "requests per second",
            "p50",
            "p99",
            "admitted",
            "refused",
            "missed",
        ] {
            assert!(text.contains(label), "no {label:?} in the chart");
        }
        // Six series, each a polyline (and a short one in its legend).
        assert!(text.matches("<polyline").count() >= 6, "{text}");
    }

    #[test]
    fn an_empty_timeline_still_draws_axes() {
        let text = svg("empty", &[]).unwrap();
        assert!(text.contains("latency, ms"));
    }

    #[test]
    fn an_unwritable_path_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir").join("run.svg");
        let error = write(&path, "x", &[point(1.0, 1.0)]).unwrap_err();
        assert!(
            format!("{error:#}").contains("no-such-dir/run.svg"),
            "{error:#}"
        );
    }
}
