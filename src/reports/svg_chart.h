#pragma once

// A small chart drawn as inline SVG, for the HTML report: no scripts, no
// external files, so the report is one file that renders anywhere.

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace batchtune {

/// What an axis counts, for its tick labels: plain numbers (1, 2, 5 x 10^k,
/// with k/M/G), bytes (in KiB/MiB/GiB), seconds (ms below one second),
/// percent, or batch sizes (whole numbers).
enum class AxisUnit { kNumber, kBytes, kSeconds, kPercent, kBatch };

struct SvgSeries {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;  ///< (x, y)
  /// Per point, the (low, high) of an error bar; empty for none.
  std::vector<std::pair<double, double>> error_bars;
  /// Joined by a line; false: the points alone.
  bool line = true;
  /// Each point drawn as a dot; false: the line alone (a dense timeline).
  bool dots = true;
  /// Points drawn as crosses (failed trials) instead of dots.
  bool crosses = false;
  double stroke_width = 2;
};

/// A horizontal line across the plot (the memory capacity, the usable limit).
struct SvgLimit {
  double y = 0;
  std::string label;
  std::string color = "#c0392b";
  bool dashed = true;
};

/// A shaded span of x (the trial that ran then), labelled at its top.
struct SvgBand {
  double x0 = 0;
  double x1 = 0;
  std::string label;
  std::string color = "#eaf2fb";
};

struct SvgChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_x = false;  ///< batch sizes: a doubling is one step
  std::vector<SvgSeries> series;
  std::vector<SvgLimit> limits;
  /// A marked point (the chosen batch), with its label.
  std::optional<std::pair<std::pair<double, double>, std::string>> marker;
  AxisUnit x_unit = AxisUnit::kNumber;
  AxisUnit y_unit = AxisUnit::kNumber;
  /// A fixed top of the y axis (100 for percent); nullopt: from the data.
  std::optional<double> y_max;
  /// Extra x ticks drawn in bold (the largest batch that fits), kept when
  /// others crowd them.
  std::vector<double> highlight_x;
  std::vector<SvgBand> bands;
};

/// Tick values from 0 (or `lo`) to at least `hi`: steps of 1, 2 or 5 x 10^k,
/// about `target` of them. For bytes the steps are those of the unit
/// (KiB/MiB/GiB) the range is read in.
std::vector<double> nice_ticks(double lo, double hi, int target, AxisUnit unit);

/// A tick label: "5", "20k", "1.5M"; "256 MiB"; "50 ms", "2 s"; "40 %"; "960".
/// `step` (between ticks) sets the decimals, `top` (of the axis) the unit.
std::string axis_label(double value, AxisUnit unit, double step, double top);

/// The chart as an `<svg>` element.
std::string render_svg(const SvgChart& chart);

}  // namespace batchtune
