#include "reports/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace batchtune {
namespace {

constexpr double kWidth = 660;
constexpr double kHeight = 330;
constexpr double kLeft = 78;
constexpr double kRight = 20;
constexpr double kTop = 40;
constexpr double kBottom = 48;
/// About this many intervals on a value axis.
constexpr int kTicks = 5;
/// Tick labels on the x axis keep at least this many pixels apart.
constexpr double kMinTickGapPx = 36;

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

/// 1, 2 or 5 x 10^k: the nice step nearest `raw` (so that the tick count
/// stays near the target).
double nice_step(double raw) {
  if (!(raw > 0) || !std::isfinite(raw)) return 1;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  const double nice = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  return nice * magnitude;
}

/// KiB, MiB or GiB (or bytes) for an axis that reaches `top` bytes.
std::pair<double, const char*> byte_unit(double top) {
  if (top >= 1024.0 * 1024 * 1024) return {1024.0 * 1024 * 1024, "GiB"};
  if (top >= 1024.0 * 1024) return {1024.0 * 1024, "MiB"};
  if (top >= 1024.0) return {1024.0, "KiB"};
  return {1, "B"};
}

/// Decimals that show a step of `step` (in the label's unit).
int decimals_for(double step) {
  if (!(step > 0) || step >= 1) return 0;
  return std::min(6, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
}

std::string number(double v, int decimals) { return fmt::format("{:.{}f}", v, decimals); }

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target, AxisUnit unit) {
  if (!(hi > lo)) hi = lo + 1;
  double scale = 1;
  if (unit == AxisUnit::kBytes) scale = byte_unit(hi).first;
  const double step = nice_step((hi - lo) / scale / std::max(1, target)) * scale;
  std::vector<double> ticks;
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (double t = first;; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
    if (t >= hi - step * 1e-9 || ticks.size() > 100) break;
  }
  return ticks;
}

std::string axis_label(double v, AxisUnit unit, double step, double top) {
  switch (unit) {
    case AxisUnit::kBytes: {
      if (v == 0) return "0";
      const auto [scale, name] = byte_unit(top);
      return fmt::format("{} {}", number(v / scale, decimals_for(step / scale)), name);
    }
    case AxisUnit::kSeconds:
      if (v == 0) return "0";
      if (top < 1) return fmt::format("{} ms", number(v * 1e3, decimals_for(step * 1e3)));
      return fmt::format("{} s", number(v, decimals_for(step)));
    case AxisUnit::kPercent: return fmt::format("{} %", number(v, decimals_for(step)));
    case AxisUnit::kBatch: return fmt::format("{:.0f}", v);
    case AxisUnit::kNumber: break;
  }
  const double a = std::max(std::abs(top), std::abs(v));
  const auto scaled = [&](double scale, const char* suffix) {
    return number(v / scale, decimals_for(step / scale)) + suffix;
  };
  if (a >= 1e9) return scaled(1e9, "G");
  if (a >= 1e6) return scaled(1e6, "M");
  if (a >= 1e4) return scaled(1e3, "k");
  return number(v, decimals_for(step));
}

std::string render_svg(const SvgChart& chart) {
  const auto fx = [&](double x) { return chart.log2_x ? std::log2(std::max(x, 1e-9)) : x; };
  double x0 = INFINITY, x1 = -INFINITY, ymax = 0;
  for (const auto& s : chart.series) {
    for (size_t i = 0; i < s.points.size(); ++i) {
      x0 = std::min(x0, fx(s.points[i].first));
      x1 = std::max(x1, fx(s.points[i].first));
      ymax = std::max(ymax, s.points[i].second);
      if (i < s.error_bars.size()) ymax = std::max(ymax, s.error_bars[i].second);
    }
  }
  for (const auto& b : chart.bands) {
    x0 = std::min(x0, fx(b.x0));
    x1 = std::max(x1, fx(b.x1));
  }
  for (const auto& l : chart.limits) ymax = std::max(ymax, l.y);
  for (double x : chart.highlight_x) {
    x0 = std::min(x0, fx(x));
    x1 = std::max(x1, fx(x));
  }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1;
  if (chart.y_max) ymax = *chart.y_max;
  if (ymax <= 0) ymax = 1;
  // The y axis ends on a tick at or above the data, headroom for the legend.
  const std::vector<double> y_ticks =
      nice_ticks(0, chart.y_max ? ymax : ymax * 1.06, kTicks, chart.y_unit);
  const double y_step = y_ticks.size() > 1 ? y_ticks[1] - y_ticks[0] : ymax;
  const double y1 = y_ticks.back();
  std::vector<double> x_ticks;
  double x_step = 1;
  if (chart.log2_x) {
    // A doubling per tick, the ends a little inside the frame.
    const double lo = std::floor(x0), hi = std::ceil(x1);
    for (double e = lo; e <= hi; ++e) x_ticks.push_back(std::pow(2, e));
    x0 -= 0.25;
    x1 += 0.25;
  } else {
    x0 = std::min(0.0, x0);
    x_ticks = nice_ticks(x0, x1, kTicks, chart.x_unit);
    x_step = x_ticks.size() > 1 ? x_ticks[1] - x_ticks[0] : 1;
    x1 = std::max(x1, x_ticks.back());
  }
  if (x1 <= x0) x1 = x0 + 1;
  const double w = kWidth - kLeft - kRight;
  const double h = kHeight - kTop - kBottom;
  const auto px = [&](double x) { return kLeft + (fx(x) - x0) / (x1 - x0) * w; };
  const auto py = [&](double y) { return kTop + h - std::clamp(y, 0.0, y1) / y1 * h; };

  std::string svg = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{0}' height='{1}' viewBox='0 0 {0} {1}' "
      "font-family='sans-serif' font-size='12'>\n"
      "<text x='{2}' y='20' font-size='15' font-weight='bold'>{3}</text>\n"
      "<rect x='{2}' y='{4}' width='{5}' height='{6}' fill='#fcfcfc' stroke='#bbb'/>\n",
      kWidth, kHeight, kLeft, escape(chart.title), kTop, w, h);
  for (size_t i = 0; i < chart.bands.size(); ++i) {
    const auto& b = chart.bands[i];
    const double bx0 = px(b.x0), bx1 = std::max(px(b.x1), bx0 + 0.5);
    svg += fmt::format("<rect class='band' x='{:.1f}' y='{}' width='{:.1f}' height='{}' fill='{}'>"
                       "<title>{}</title></rect>\n",
                       bx0, kTop, bx1 - bx0, h, escape(b.color), escape(b.label));
    // Font size 10: about 6 px a digit.
    if (bx1 - bx0 >= 6.0 * static_cast<double>(b.label.size()) + 2) {
      svg += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle' font-size='10' "
                         "fill='#555'>{}</text>\n",
                         (bx0 + bx1) / 2, kTop + 12, escape(b.label));
    }
  }
  for (double y : y_ticks) {
    svg += fmt::format(
        "<line x1='{0}' x2='{1}' y1='{2:.1f}' y2='{2:.1f}' stroke='#e4e4e4'/>"
        "<text class='ytick' x='{3}' y='{4:.1f}' text-anchor='end'>{5}</text>\n",
        kLeft, kLeft + w, py(y), kLeft - 6, py(y) + 4, axis_label(y, chart.y_unit, y_step, y1));
  }
  // x ticks: thinned to fit, the highlighted ones kept and bold.
  std::vector<double> highlighted_px;
  for (double x : chart.highlight_x) highlighted_px.push_back(px(x));
  double last_px = -1e9;
  for (double x : x_ticks) {
    const double p = px(x);
    if (p < kLeft - 1 || p > kLeft + w + 1 || p - last_px < kMinTickGapPx) continue;
    const bool crowded = std::any_of(highlighted_px.begin(), highlighted_px.end(),
                                     [&](double hp) { return std::abs(hp - p) < kMinTickGapPx; });
    if (crowded) continue;
    last_px = p;
    svg += fmt::format(
        "<line x1='{0:.1f}' x2='{0:.1f}' y1='{1}' y2='{2}' stroke='#eee'/>"
        "<text class='xtick' x='{0:.1f}' y='{3:.1f}' text-anchor='middle'>{4}</text>\n",
        p, kTop, kTop + h, kTop + h + 16,
        axis_label(x, chart.log2_x ? AxisUnit::kBatch : chart.x_unit, x_step, x1));
  }
  for (double x : chart.highlight_x) {
    svg += fmt::format(
        "<line x1='{0:.1f}' x2='{0:.1f}' y1='{1}' y2='{2}' stroke='#999' stroke-dasharray='2 3'/>"
        "<text class='xtick highlight' x='{0:.1f}' y='{3:.1f}' text-anchor='middle' "
        "font-weight='bold'>{4}</text>\n",
        px(x), kTop, kTop + h, kTop + h + 16,
        axis_label(x, chart.log2_x ? AxisUnit::kBatch : chart.x_unit, x_step, x1));
  }
  svg += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle'>{}</text>\n",
                     kLeft + w / 2, kHeight - 8, escape(chart.x_label));
  svg += fmt::format(
      "<text transform='translate(14,{:.1f}) rotate(-90)' text-anchor='middle'>{}</text>\n",
      kTop + h / 2, escape(chart.y_label));
  for (size_t i = 0; i < chart.limits.size(); ++i) {
    const auto& l = chart.limits[i];
    // Labels alternate right and left so that two close lines stay readable.
    const bool right = i % 2 == 0;
    svg += fmt::format(
        "<line class='limit' x1='{0}' x2='{1}' y1='{2:.1f}' y2='{2:.1f}' stroke='{3}' "
        "stroke-width='1.5'{4}/>"
        "<text x='{5:.1f}' y='{6:.1f}' text-anchor='{7}' fill='{3}'>{8}</text>\n",
        kLeft, kLeft + w, py(l.y), escape(l.color), l.dashed ? " stroke-dasharray='6 4'" : "",
        right ? kLeft + w - 4 : kLeft + 4, py(l.y) + (right ? -5 : 14), right ? "end" : "start",
        escape(l.label));
  }
  double legend_x = kLeft + 8;
  for (const auto& s : chart.series) {
    if (s.line && s.points.size() > 1) {
      std::string path;
      for (const auto& [x, y] : s.points) {
        path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", px(x), py(y));
      }
      svg += fmt::format("<path d='{}' fill='none' stroke='{}' stroke-width='{}'/>\n", path,
                         s.color, s.stroke_width);
    }
    for (size_t i = 0; i < s.error_bars.size() && i < s.points.size(); ++i) {
      const double x = px(s.points[i].first);
      const double lo = py(s.error_bars[i].first), hi = py(s.error_bars[i].second);
      svg += fmt::format(
          "<path class='errorbar' d='M{0:.1f},{1:.1f} L{0:.1f},{2:.1f} M{3:.1f},{1:.1f} "
          "L{4:.1f},{1:.1f} M{3:.1f},{2:.1f} L{4:.1f},{2:.1f}' stroke='{5}' fill='none'/>\n",
          x, lo, hi, x - 4, x + 4, s.color);
    }
    if (s.dots || s.crosses) {
      for (const auto& [x, y] : s.points) {
        if (s.crosses) {
          svg += fmt::format(
              "<path class='cross' d='M{0:.1f},{1:.1f} L{2:.1f},{3:.1f} M{0:.1f},{3:.1f} "
              "L{2:.1f},{1:.1f}' stroke='{4}' stroke-width='2.5'/>\n",
              px(x) - 5, py(y) - 5, px(x) + 5, py(y) + 5, s.color);
        } else {
          svg += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='3' fill='{}'/>\n", px(x), py(y),
                             s.color);
        }
      }
    }
    svg += fmt::format(
        "<rect x='{:.1f}' y='{:.1f}' width='12' height='{}' fill='{}'/>"
        "<text x='{:.1f}' y='{:.1f}'>{}</text>\n",
        legend_x, kTop - 13, s.crosses ? 10 : 3, s.color, legend_x + 16, kTop - 8,
        escape(s.name));
    legend_x += 30 + 6.5 * static_cast<double>(s.name.size());
  }
  if (chart.marker) {
    const auto [pt, label] = *chart.marker;
    svg += fmt::format(
        "<circle cx='{0:.1f}' cy='{1:.1f}' r='7' fill='none' stroke='#e67e22' stroke-width='3'/>"
        "<text x='{0:.1f}' y='{2:.1f}' text-anchor='{4}' fill='#e67e22' "
        "font-weight='bold'>{3}</text>\n",
        px(pt.first), py(pt.second), py(pt.second) - 12, escape(label),
        px(pt.first) > kLeft + 0.8 * w ? "end" : px(pt.first) < kLeft + 0.2 * w ? "start"
                                                                                : "middle");
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace batchtune
