//! SVG charts of replay reports (plotters, SVG backend, no font dependencies).
use super::{ReplayReport, ReplayedRound};
use anyhow::{anyhow, Result};
use plotters::prelude::*;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn e<E: std::fmt::Debug>(err: E) -> anyhow::Error {
    anyhow!("drawing the chart: {err:?}")
}

/// A line chart: one series per (label, values), x = index.
fn lines(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    y_desc: &str,
    series: &[(String, Vec<f64>)],
) -> Result<()> {
    let xmax = series
        .iter()
        .map(|(_, v)| v.len())
        .max()
        .unwrap_or(1)
        .max(2);
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(0f64..(xmax - 1) as f64, 0f64..ymax * 1.1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("round")
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(e)?;
    for (i, (label, v)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                v.iter().enumerate().map(|(x, y)| (x as f64, *y)),
                c.stroke_width(2),
            ))
            .map_err(e)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

fn label(r: &ReplayReport) -> String {
    let mut s = r.schedule.clone();
    if !r.schedule_config.is_empty() {
        s += &format!(" {}", r.schedule_config);
    }
    s += &format!(" / {}", r.acceptance);
    if !r.acceptance_config.is_empty() {
        s += &format!(" {}", r.acceptance_config);
    }
    s
}

/// Draft length and accepted drafts per round, one line per policy pair
/// (reports made with per-round data).
pub fn rounds_svg(reports: &[ReplayReport]) -> Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1000, 700)).into_drawing_area();
        root.fill(&WHITE).map_err(e)?;
        let (top, bottom) = root.split_vertically(350);
        // One series per report: `f` of each of its rounds.
        let series = |f: fn(&ReplayedRound) -> f64| -> Vec<(String, Vec<f64>)> {
            let per = |r: &ReplayReport| r.per_round.iter().map(f).collect();
            reports.iter().map(|r| (label(r), per(r))).collect()
        };
        let k = series(|x| x.drafted as f64);
        let a = series(|x| x.accepted as f64);
        lines(&top, "draft length per round", "drafted", &k)?;
        lines(&bottom, "accepted drafts per round", "accepted", &a)?;
        root.present().map_err(e)?;
    }
    Ok(out)
}

/// A bar chart of speedups: (label, speedup) per bar, with a line at 1.0.
pub fn speedup_svg(title: &str, bars: &[(String, f64)]) -> Result<String> {
    let mut out = String::new();
    {
        let h = 120 + 28 * bars.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut out, (1000, h)).into_drawing_area();
        root.fill(&WHITE).map_err(e)?;
        let xmax = bars.iter().map(|b| b.1).fold(1.0f64, f64::max) * 1.15;
        let n = bars.len().max(1);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(330)
            .build_cartesian_2d(0f64..xmax, (0..n - 1).into_segmented())
            .map_err(e)?;
        let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("speedup over plain decoding")
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(e)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, s))| {
                let c = COLORS[i % COLORS.len()];
                let mut r = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (*s, SegmentValue::Exact(i + 1)),
                    ],
                    c.filled(),
                );
                r.set_margin(4, 4, 0, 0);
                r
            }))
            .map_err(e)?
            .label("speedup");
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(1.0, SegmentValue::Exact(0)), (1.0, SegmentValue::Last)],
                BLACK.stroke_width(1),
            )))
            .map_err(e)?;
        for (i, (_, s)) in bars.iter().enumerate() {
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("{s:.2}x"),
                    (*s, SegmentValue::CenterOf(i)),
                    ("sans-serif", 13),
                )))
                .map_err(e)?;
        }
        root.present().map_err(e)?;
    }
    Ok(out)
}
