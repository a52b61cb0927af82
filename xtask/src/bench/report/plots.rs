//! The report's SVG plots (plotters): new connections per second by
//! Services count, and the per-packet cost by Services count.

use std::path::Path;

use plotters::prelude::*;

use crate::bench::fmt::size_label;
use crate::bench::paths::{DIRECT, DIRECT_HOST};
use crate::bench::results::{Case, PerPacket, Results};

/// Draws both plots into `dir`; a plot that fails is reported and left out.
pub fn draw(results: &Results, dir: &Path) {
    if let Err(e) = plot_conn(results, &dir.join("conn_per_s.svg")) {
        eprintln!("bench: plot conn_per_s.svg: {e}");
    }
    let none = PerPacket::default();
    let pp = results.perpacket.as_ref().unwrap_or(&none);
    if let Err(e) = plot_perpacket(pp, &dir.join("perpacket.svg")) {
        eprintln!("bench: plot perpacket.svg: {e}");
    }
}

const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// Every path's connections/s by Services count; host-client paths dashed.
fn plot_conn(results: &Results, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let e2e = results.e2e();
    let paths = results.e2e_paths();
    let sizes = results.e2e_sizes();
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let ymax = e2e
        .iter()
        .filter_map(|r| r.m.conn_per_s)
        .fold(0.0f64, f64::max)
        * 1.6; // room for the legend above the lines
    let n = sizes.len().max(1);
    let labels: Vec<String> = sizes.iter().map(|s| size_label(*s)).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "New TCP connections per second (higher is better)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), 0f64..ymax.max(1.0))?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc("Services")
        .y_desc("connections/s")
        .draw()?;
    for (i, (key, label)) in paths.iter().enumerate() {
        let pts: Vec<(f64, f64)> = sizes
            .iter()
            .enumerate()
            .filter_map(|(x, s)| results.conn(key, Some(*s)).map(|v| (x as f64, v)))
            .collect();
        let color = COLORS[i % COLORS.len()];
        let style = color.stroke_width(2);
        let label = if key == DIRECT || key == DIRECT_HOST {
            format!("{label}: no Service, the limit")
        } else {
            label.clone()
        };
        let series = if label.contains("host client") {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))?
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), style))?
        };
        series.label(label).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
        });
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn plot_perpacket(pp: &PerPacket, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let sizes = pp.sizes();
    let empty = pp.empty_tc_ns;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let keys: [(Case, &str); 4] = [
        (
            |r| r.from_pod_service_existing_ns,
            "sb_from_pod, Service, existing flow",
        ),
        (|r| r.from_pod_non_service_ns, "sb_from_pod, non-service"),
        (|r| r.to_pod_reply_ns, "sb_to_pod, reply"),
        (|r| r.to_pod_non_service_ns, "sb_to_pod, non-service"),
    ];
    let ymax = pp
        .rows
        .iter()
        .flat_map(|r| keys.iter().filter_map(move |(k, _)| k(r)))
        .fold(empty.unwrap_or(0.0), f64::max)
        * 1.2;
    let n = sizes.len().max(1);
    let labels: Vec<String> = sizes.iter().map(|s| size_label(*s)).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Per-packet cost, tc (lower is better; 1 backend per Service)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), 0f64..ymax.max(1.0))?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc("Services loaded")
        .y_desc("ns per packet")
        .draw()?;
    for (i, (key, name)) in keys.iter().enumerate() {
        let pts: Vec<(f64, f64)> = sizes
            .iter()
            .enumerate()
            .filter_map(|(x, s)| pp.ns(*s, *key).map(|v| (x as f64, v)))
            .collect();
        let color = COLORS[i];
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    if let Some(e) = empty {
        chart
            .draw_series(LineSeries::new(
                vec![(-0.3, e), (n as f64 - 0.7, e)],
                COLORS[4].stroke_width(2),
            ))?
            .label("empty tc program (floor)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], COLORS[4]));
        chart
            .draw_series(LineSeries::new(
                vec![(-0.3, 3.0 * e), (n as f64 - 0.7, 3.0 * e)],
                BLACK.mix(0.4).stroke_width(1),
            ))?
            .label("3 × empty (goal)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
