//! The chart of `compare`: one panel per policy, stacked on a shared time axis.
//!
//! plotters draws the SVG (its SVG backend writes text as `<text>` elements, so it needs no font
//! files); the PNG is that SVG rasterised by resvg with the bundled DejaVu Sans, so it looks the
//! same on every machine.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::duration::duration;

/// About this many bars across the chart.
const BARS: u64 = 120;
const WIDTH: u32 = 1200;
const HEADER: u32 = 64;
const PANEL: u32 = 130;
const AXIS: u32 = 46;

const ADMITTED: RGBColor = RGBColor(46, 125, 50);
const REJECTED: RGBColor = RGBColor(239, 154, 154);
const LIMIT: RGBColor = RGBColor(21, 101, 192);
const TEXT: RGBColor = RGBColor(33, 33, 33);

/// The bar width for a trace ending at `end` ns: the shortest of 1, 2 or 5 times a power of ten
/// nanoseconds that covers the trace in at most [`BARS`] bars.
pub(crate) fn bucket_width(end: u64) -> u64 {
    let need = end / BARS + 1;
    let mut scale = 1u64;
    loop {
        for step in [1, 2, 5] {
            let width = scale.saturating_mul(step);
            if width >= need {
                return width;
            }
        }
        scale = scale.saturating_mul(10);
    }
}

/// One policy's panel.
pub(crate) struct Panel {
    /// The policy, as its canonical spec.
    pub(crate) label: String,
    /// A line of totals shown next to the label.
    pub(crate) note: String,
    /// Admitted and rejected cost per bucket.
    pub(crate) series: Vec<[u64; 2]>,
    /// The limit line: `limit` per `span_ns`, drawn at its rate per bucket.
    pub(crate) limit: u64,
    pub(crate) span_ns: u64,
}

pub(crate) struct Chart {
    pub(crate) title: String,
    pub(crate) bucket_ns: u64,
    /// What the bars count: `requests`, or `cost` when some requests cost more than 1.
    pub(crate) unit: &'static str,
    pub(crate) panels: Vec<Panel>,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn failed(e: impl std::fmt::Display) -> String {
    format!("cannot draw the chart: {e}")
}

impl Chart {
    /// The chart as an SVG document.
    pub(crate) fn svg(&self) -> Result<String, String> {
        let n = self.panels.len() as u32;
        let height = HEADER + n * PANEL + AXIS;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
            root.fill(&WHITE).map_err(failed)?;
            let (header, mut rest) = root.split_vertically(HEADER);
            self.header(&header)?;
            // Every panel has the same scales: what differs between them is the policy alone.
            let buckets = self.panels.iter().map(|p| p.series.len()).max().unwrap_or(0).max(1);
            let x_max = buckets as f64 * self.bucket_ns as f64;
            let tallest = self.panels.iter().flat_map(|p| &p.series).map(|[a, r]| a + r).max();
            let line = |p: &Panel| p.limit as f64 * self.bucket_ns as f64 / p.span_ns as f64;
            let top = self.panels.iter().map(line).fold(tallest.unwrap_or(1) as f64, f64::max);
            let y_max = (top * 1.08).max(1.0);
            for (i, panel) in self.panels.iter().enumerate() {
                let last = i + 1 == self.panels.len();
                let (area, below) = rest.split_vertically(if last { PANEL + AXIS } else { PANEL });
                rest = below;
                self.panel(&area, panel, last, x_max, y_max, line(panel))?;
            }
            root.present().map_err(failed)?;
        }
        Ok(svg)
    }

    fn header(&self, area: &Area<'_>) -> Result<(), String> {
        let title = ("sans-serif", 20).into_font().color(&TEXT);
        area.draw(&Text::new(self.title.as_str(), (16, 10), title)).map_err(failed)?;
        let small = ("sans-serif", 14).into_font().color(&TEXT);
        let bucket = duration(self.bucket_ns);
        let mut x = 16;
        let y = 40;
        for (color, text) in [
            (ADMITTED, format!("admitted {} per {bucket}", self.unit)),
            (REJECTED, format!("rejected {} per {bucket}", self.unit)),
        ] {
            area.draw(&Rectangle::new([(x, y), (x + 14, y + 14)], color.filled()))
                .map_err(failed)?;
            area.draw(&Text::new(text.clone(), (x + 20, y), small.clone())).map_err(failed)?;
            x += 30 + 8 * text.len() as i32;
        }
        area.draw(&PathElement::new(vec![(x, y + 7), (x + 24, y + 7)], LIMIT.stroke_width(2)))
            .map_err(failed)?;
        let text = "the limit's average rate (a bar above it is a burst)";
        area.draw(&Text::new(text, (x + 30, y), small)).map_err(failed)?;
        Ok(())
    }

    fn panel(
        &self,
        area: &Area<'_>,
        panel: &Panel,
        last: bool,
        x_max: f64,
        y_max: f64,
        line: f64,
    ) -> Result<(), String> {
        let (scale, unit) = time_unit(x_max as u64);
        let mut chart = ChartBuilder::on(area)
            .margin_left(12)
            .margin_right(24)
            .margin_top(6)
            .x_label_area_size(if last { AXIS } else { 0 })
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(failed)?;
        let mut mesh = chart.configure_mesh();
        mesh.disable_x_mesh()
            .y_labels(4)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .light_line_style(RGBColor(238, 238, 238))
            .bold_line_style(RGBColor(224, 224, 224))
            .axis_style(RGBColor(120, 120, 120))
            .label_style(("sans-serif", 12).into_font().color(&TEXT));
        let x_formatter = |x: &f64| format!("{}{unit}", trim(x / scale));
        if last {
            mesh.x_labels(12)
                .x_label_formatter(&x_formatter)
                .x_desc("time since the trace's start");
        } else {
            mesh.x_labels(0);
        }
        mesh.draw().map_err(failed)?;
        let width = self.bucket_ns as f64;
        let bars = |(i, counts): (usize, &[u64; 2]), which: usize| {
            let x0 = i as f64 * width;
            let x1 = x0 + width * 0.86;
            let low = if which == 0 { 0 } else { counts[0] };
            let high = low + counts[which];
            let color = if which == 0 { ADMITTED } else { REJECTED };
            Rectangle::new([(x0, low as f64), (x1, high as f64)], color.filled())
        };
        for which in [0, 1] {
            let nonzero = panel.series.iter().enumerate().filter(|(_, c)| c[which] > 0);
            chart.draw_series(nonzero.map(|bar| bars(bar, which))).map_err(failed)?;
        }
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, line), (x_max, line)],
                LIMIT.stroke_width(2),
            )))
            .map_err(failed)?;
        // The label inside the panel, top left, above the bars' usual height.
        let plot = chart.plotting_area();
        let (x_range, y_range) = (plot.get_x_range(), plot.get_y_range());
        let at = (x_range.start + (x_range.end - x_range.start) * 0.005, y_range.end * 0.97);
        let bold = ("sans-serif", 15).into_font().style(FontStyle::Bold).color(&TEXT);
        plot.draw(&Text::new(panel.label.clone(), at, bold)).map_err(failed)?;
        let note = ("sans-serif", 13).into_font().color(&RGBColor(80, 80, 80));
        let at = (at.0, y_range.end * 0.80);
        plot.draw(&Text::new(panel.note.clone(), at, note)).map_err(failed)?;
        Ok(())
    }
}

/// The unit of the time axis: ns per unit, and its name.
fn time_unit(span_ns: u64) -> (f64, &'static str) {
    match span_ns {
        0..1_000 => (1.0, "ns"),
        1_000..1_000_000 => (1e3, "us"),
        1_000_000..1_000_000_000 => (1e6, "ms"),
        1_000_000_000..120_000_000_000 => (1e9, "s"),
        120_000_000_000..7_200_000_000_000 => (60e9, "m"),
        _ => (3600e9, "h"),
    }
}

fn trim(x: f64) -> String {
    let text = format!("{x:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The bundled font (DejaVu Sans, see `assets/DejaVuSans-LICENSE`).
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Rasterise the chart's SVG to PNG with the bundled font.
pub(crate) fn png(svg: &str) -> Result<Vec<u8>, String> {
    use resvg::{tiny_skia, usvg};
    let mut options = usvg::Options::default();
    options.fontdb_mut().load_font_data(FONT.to_vec());
    options.fontdb_mut().set_sans_serif_family("DejaVu Sans");
    options.font_family = "DejaVu Sans".into();
    let tree = usvg::Tree::from_str(svg, &options).map_err(failed)?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| failed("the image is empty"))?;
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(failed)
}
