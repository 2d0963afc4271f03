// Svg: builds an inline SVG picture as text, for the run report (run_report.h). Coordinates
// are user units of the picture's viewBox; every text given is escaped. Not thread-safe.
//
//   Svg svg(600, 200);
//   svg.Rect(10, 10, 100, 20, "#4477aa", "restore: 223 ms");   // the last argument: a tooltip
//   svg.Text(10, 50, "restore", "start");
//   std::string html = svg.Finish("timeline");                 // <svg id="timeline" ...>...</svg>
#ifndef STRETCH_REPORT_SVG_H_
#define STRETCH_REPORT_SVG_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace stretch::report {

// `text` with &, <, >, " and ' escaped, for HTML text and attribute values.
std::string HtmlEscape(absl::string_view text);

class Svg {
 public:
  Svg(double width, double height) : width_(width), height_(height) {}

  // A filled rectangle; `tooltip`, if not empty, shows on hover (an SVG <title>).
  void Rect(double x, double y, double w, double h, absl::string_view fill,
            absl::string_view tooltip = "");
  void Line(double x1, double y1, double x2, double y2, absl::string_view stroke, double width = 1,
            bool dashed = false);
  // anchor: "start", "middle" or "end".
  void Text(double x, double y, absl::string_view text, absl::string_view anchor = "start",
            double size = 11, absl::string_view fill = "#222");
  // A line through the points, in order.
  void Polyline(const std::vector<std::pair<double, double>>& points, absl::string_view stroke,
                double width = 1.5);

  // The picture: <svg id=ID ...>...</svg>, scaling to the page's width.
  std::string Finish(absl::string_view id) const;

 private:
  const double width_, height_;
  std::string body_;
};

// Round axis ticks from 0 to at least `max`: about `count` steps of 1, 2 or 5 times a power of
// ten. `max` <= 0 gives 0 and 1.
std::vector<double> AxisTicks(double max, int count);

}  // namespace stretch::report

#endif  // STRETCH_REPORT_SVG_H_
