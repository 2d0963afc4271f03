#include "report/svg.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stretch::report {

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

void Svg::Rect(double x, double y, double w, double h, absl::string_view fill,
               absl::string_view tooltip) {
  absl::StrAppendFormat(&body_, R"(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s")",
                        x, y, std::max(w, 0.0), std::max(h, 0.0), HtmlEscape(fill));
  if (tooltip.empty()) {
    body_ += "/>";
  } else {
    absl::StrAppend(&body_, "><title>", HtmlEscape(tooltip), "</title></rect>");
  }
}

void Svg::Line(double x1, double y1, double x2, double y2, absl::string_view stroke, double width,
               bool dashed) {
  absl::StrAppendFormat(
      &body_,
      R"(<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"%s/>)", x1,
      y1, x2, y2, HtmlEscape(stroke), width, dashed ? R"( stroke-dasharray="4 3")" : "");
}

void Svg::Text(double x, double y, absl::string_view text, absl::string_view anchor, double size,
               absl::string_view fill) {
  absl::StrAppendFormat(
      &body_, R"(<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%.0f" fill="%s">%s</text>)", x,
      y, HtmlEscape(anchor), size, HtmlEscape(fill), HtmlEscape(text));
}

void Svg::Polyline(const std::vector<std::pair<double, double>>& points, absl::string_view stroke,
                   double width) {
  if (points.empty()) return;
  std::string coords;
  for (const auto& [x, y] : points) {
    absl::StrAppendFormat(&coords, "%s%.1f,%.1f", coords.empty() ? "" : " ", x, y);
  }
  absl::StrAppendFormat(&body_,
                        R"(<polyline points="%s" fill="none" stroke="%s" stroke-width="%.1f"/>)",
                        coords, HtmlEscape(stroke), width);
}

std::string Svg::Finish(absl::string_view id) const {
  return absl::StrFormat(
      R"(<svg id="%s" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %.0f %.0f" )"
      R"(width="100%%" style="max-width:%.0fpx" font-family="sans-serif">%s</svg>)",
      HtmlEscape(id), width_, height_, width_, body_);
}

std::vector<double> AxisTicks(double max, int count) {
  if (!(max > 0) || count < 1) return {0, 1};
  const double raw = max / count;
  const double power = std::pow(10, std::floor(std::log10(raw)));
  double step = power;
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (int i = 0; ticks.empty() || ticks.back() < max; ++i) ticks.push_back(i * step);
  return ticks;
}

}  // namespace stretch::report
