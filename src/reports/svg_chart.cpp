#include "reports/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace batchtune {
namespace {

constexpr double kWidth = 640;
constexpr double kHeight = 320;
constexpr double kLeft = 70;
constexpr double kRight = 20;
constexpr double kTop = 36;
constexpr double kBottom = 48;
constexpr int kTicks = 5;

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string tick_label(double v) {
  if (std::abs(v) >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
  if (std::abs(v) >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (std::abs(v) >= 1e3) return fmt::format("{:.3g}k", v / 1e3);
  return fmt::format("{:.3g}", v);
}

}  // namespace

std::string render_svg(const SvgChart& chart) {
  const auto fx = [&](double x) { return chart.log2_x ? std::log2(std::max(x, 1e-9)) : x; };
  double x0 = INFINITY, x1 = -INFINITY, y1 = 0;
  for (const auto& s : chart.series) {
    for (const auto& [x, y] : s.points) {
      x0 = std::min(x0, fx(x));
      x1 = std::max(x1, fx(x));
      y1 = std::max(y1, y);
    }
  }
  if (chart.limit) y1 = std::max(y1, chart.limit->first);
  if (!std::isfinite(x0)) x0 = 0, x1 = 1;
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= 0) y1 = 1;
  y1 *= 1.08;
  const double w = kWidth - kLeft - kRight;
  const double h = kHeight - kTop - kBottom;
  const auto px = [&](double x) { return kLeft + (fx(x) - x0) / (x1 - x0) * w; };
  const auto py = [&](double y) { return kTop + h - y / y1 * h; };

  std::string svg = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{0}' height='{1}' viewBox='0 0 {0} {1}' "
      "font-family='sans-serif' font-size='12'>\n"
      "<text x='{2}' y='20' font-size='15' font-weight='bold'>{3}</text>\n"
      "<rect x='{2}' y='{4}' width='{5}' height='{6}' fill='#fafafa' stroke='#bbb'/>\n",
      kWidth, kHeight, kLeft, escape(chart.title), kTop, w, h);
  for (int i = 0; i <= kTicks; ++i) {
    const double y = y1 * i / kTicks;
    svg += fmt::format(
        "<line x1='{0}' x2='{1}' y1='{2:.1f}' y2='{2:.1f}' stroke='#e4e4e4'/>"
        "<text x='{3}' y='{4:.1f}' text-anchor='end'>{5}</text>\n",
        kLeft, kLeft + w, py(y), kLeft - 6, py(y) + 4, tick_label(y));
  }
  // x ticks at the data's x values on a log axis (batch sizes), thinned to
  // fit; evenly spaced on a linear one (seconds).
  std::vector<double> xs;
  if (chart.log2_x) {
    for (const auto& s : chart.series) {
      for (const auto& p : s.points) xs.push_back(p.first);
    }
  } else {
    for (int i = 0; i <= kTicks; ++i) xs.push_back(x0 + (x1 - x0) * i / kTicks);
  }
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  double last_px = -1e9;
  for (double x : xs) {
    if (px(x) - last_px < 34) continue;
    last_px = px(x);
    svg += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle'>{}</text>\n", px(x),
                       kTop + h + 16, tick_label(x));
  }
  svg += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle'>{}</text>\n",
                     kLeft + w / 2, kHeight - 8, escape(chart.x_label));
  svg += fmt::format(
      "<text transform='translate(14,{:.1f}) rotate(-90)' text-anchor='middle'>{}</text>\n",
      kTop + h / 2, escape(chart.y_label));
  if (chart.limit) {
    svg += fmt::format(
        "<line x1='{0}' x2='{1}' y1='{2:.1f}' y2='{2:.1f}' stroke='#c0392b' stroke-dasharray='6 4'/>"
        "<text x='{1}' y='{3:.1f}' text-anchor='end' fill='#c0392b'>{4}</text>\n",
        kLeft, kLeft + w, py(chart.limit->first), py(chart.limit->first) - 5,
        escape(chart.limit->second));
  }
  double legend_x = kLeft + 8;
  for (const auto& s : chart.series) {
    std::string path;
    for (const auto& [x, y] : s.points) {
      path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", px(x), py(y));
    }
    svg += fmt::format("<path d='{}' fill='none' stroke='{}' stroke-width='2'/>\n", path, s.color);
    for (const auto& [x, y] : s.points) {
      svg += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='3' fill='{}'/>\n", px(x), py(y),
                         s.color);
    }
    svg += fmt::format(
        "<rect x='{:.1f}' y='{:.1f}' width='12' height='3' fill='{}'/>"
        "<text x='{:.1f}' y='{:.1f}'>{}</text>\n",
        legend_x, kTop + 10, s.color, legend_x + 16, kTop + 14, escape(s.name));
    legend_x += 30 + 7 * static_cast<double>(s.name.size());
  }
  if (chart.marker) {
    const auto [pt, label] = *chart.marker;
    svg += fmt::format(
        "<circle cx='{0:.1f}' cy='{1:.1f}' r='7' fill='none' stroke='#e67e22' stroke-width='3'/>"
        "<text x='{0:.1f}' y='{2:.1f}' text-anchor='{4}' fill='#e67e22' "
        "font-weight='bold'>{3}</text>\n",
        px(pt.first), py(pt.second), py(pt.second) - 12, escape(label),
        px(pt.first) > kLeft + 0.8 * w ? "end" : "middle");
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace batchtune
