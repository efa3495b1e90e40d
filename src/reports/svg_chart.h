#pragma once

// A small line chart drawn as inline SVG, for the HTML report: no scripts,
// no external files, so the report is one file that renders anywhere.

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace batchtune {

struct SvgSeries {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;  ///< (x, y)
};

struct SvgChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_x = false;  ///< batch sizes: a doubling is one step
  std::vector<SvgSeries> series;
  /// A horizontal line (the memory capacity), with its label.
  std::optional<std::pair<double, std::string>> limit;
  /// A marked point (the chosen batch), with its label.
  std::optional<std::pair<std::pair<double, double>, std::string>> marker;
};

/// The chart as an `<svg>` element.
std::string render_svg(const SvgChart& chart);

}  // namespace batchtune
