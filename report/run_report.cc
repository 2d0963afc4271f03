#include "report/run_report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/json_value.h"
#include "core/status.h"
#include "report/svg.h"

namespace stretch::report {
namespace {

// Paul Tol's colour-blind safe palette, one colour per node.
constexpr const char* kNodeColors[] = {"#4477aa", "#ee6677", "#228833", "#ccbb44",
                                       "#66ccee", "#aa3377", "#bbbbbb"};

std::string NodeColor(int node) {
  return kNodeColors[static_cast<size_t>(node) % (sizeof(kNodeColors) / sizeof(*kNodeColors))];
}

std::string Duration(double ms) {
  if (ms >= 10'000) return absl::StrFormat("%.1f s", ms / 1000);
  if (ms >= 1000) return absl::StrFormat("%.2f s", ms / 1000);
  return absl::StrFormat("%.0f ms", ms);
}

// 25018 -> "25,018".
std::string Count(double v) {
  std::string digits = absl::StrFormat("%.0f", std::max(0.0, v));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return digits;
}

std::string Bytes(double b) {
  if (b >= 1 << 30) return absl::StrFormat("%.1f GiB", b / (1 << 30));
  if (b >= 1 << 20) return absl::StrFormat("%.1f MiB", b / (1 << 20));
  if (b >= 1 << 10) return absl::StrFormat("%.1f KiB", b / (1 << 10));
  return absl::StrFormat("%.0f B", b);
}

std::string Section(absl::string_view id, absl::string_view title, absl::string_view body) {
  return absl::StrCat("<section id=\"", id, "\"><h2>", HtmlEscape(title), "</h2>\n", body,
                      "</section>\n");
}

// One phase of the run on the timeline, in milliseconds since launch.
struct Phase {
  std::string name;
  double start, end;
  std::string color;
};

// Placement's clock starts when the replicas run (launch/launcher_run.cc); the report's at
// the launch.
double PlacementOrigin(const JsonValue& s) { return s["timeline"]["running_ms"].Number(); }

std::vector<Phase> Phases(const JsonValue& s) {
  const JsonValue& tl = s["timeline"];
  const double end = tl["end_ms"].Number();
  std::vector<Phase> phases;
  auto add = [&](const std::string& name, double start, double stop, const char* color) {
    start = std::clamp(start, 0.0, end);
    stop = std::clamp(stop, start, end);
    if (stop > start) phases.push_back(Phase{name, start, stop, color});
  };
  if (!s["migrated"].Bool() || !tl.Has("running_ms")) {
    add("native, on one node", 0, end, "#bbbbbb");
    return phases;
  }
  const JsonValue& m = s["migration"];
  const double checkpointed = tl["checkpointed_ms"].Number();
  const double stop_begin = checkpointed - m["checkpoint_ms"].Number() - m["stop_ms"].Number();
  const double parallel = m["native_parallel_ms"].Number();
  add("native", 0, stop_begin - parallel, "#bbbbbb");
  add("native, parallel work before migrating", stop_begin - parallel, stop_begin, "#999999");
  add("stop", stop_begin, stop_begin + m["stop_ms"].Number(), "#aa3377");
  add("checkpoint (criu dump)", stop_begin + m["stop_ms"].Number(), checkpointed, "#ee6677");
  const double running = tl["running_ms"].Number();
  const double restore_begin = std::max(checkpointed, running - m["restore_ms"].Number());
  add("server and agents start", checkpointed, restore_begin, "#ccbb44");
  add("restore (criu restore, every node)", restore_begin, running, "#ee9944");
  if (tl.Has("home_ms")) {
    const double home = tl["home_ms"].Number();
    const JsonValue& h = s["nodes"][0]["home"];
    const double going = h["stop_ms"].Number() + h["gather_ms"].Number() + h["dump_ms"].Number() +
                         h["restore_ms"].Number();
    const double home_begin = std::max(running, home - going);
    add("distributed", running, home_begin, "#4477aa");
    add("going home (gather, dump, restore on node 0)", home_begin, home, "#66ccee");
    add("on node 0, natively", home, end, "#228833");
  } else {
    add("distributed", running, end, "#4477aa");
  }
  return phases;
}

// Decisions that move threads (core assignments are not marked on the pictures).
bool Marked(const JsonValue& d) { return d["action"].String() != "assign_cores"; }

std::string Summary(const JsonValue& s) {
  std::vector<std::string> command;
  for (const JsonValue& a : s["command"].items()) command.push_back(a.String());
  std::string rows;
  auto row = [&rows](absl::string_view name, const std::string& value) {
    absl::StrAppend(&rows, "<tr><th>", HtmlEscape(name), "</th><td>", HtmlEscape(value),
                    "</td></tr>\n");
  };
  row("command", command.empty() ? "(not recorded)" : absl::StrJoin(command, " "));
  row("wall time, launch to exit", Duration(s["timeline"]["end_ms"].Number()));
  const JsonValue& nodes = s["nodes"];
  if (!s["migrated"].Bool()) {
    std::string why = "the program ran on one node: it was not migrated";
    if (s.Has("after_point_ms")) {
      why = "it stayed on node 0 at its migration point (placement history)";
    } else if (s.Has("native_parallel_ms")) {
      why = absl::StrFormat(
          "its parallel work ended after %s, sooner than migrating it would have paid off (%s)",
          Duration(s["native_parallel_ms"].Number()), Duration(s["migrate_after_ms"].Number()));
    }
    row("distributed", absl::StrCat("no: ", why));
    return absl::StrCat("<table class=\"kv\">", rows, "</table>\n");
  }
  row("distributed", absl::StrCat("yes, ", nodes.size(), " nodes, ", s["threads"].Number(),
                                  " threads at the migration point"));
  const JsonValue& m = s["migration"];
  row("checkpoint",
      absl::StrCat(Bytes(m["image_bytes"].Number()), ", stop ", Duration(m["stop_ms"].Number()),
                   ", dump ", Duration(m["checkpoint_ms"].Number()), ", restore ",
                   Duration(m["restore_ms"].Number())));
  std::vector<std::string> restores;
  for (const JsonValue& n : nodes.items()) {
    const JsonValue& r = n["restore"];
    if (!r.IsObject()) continue;
    restores.push_back(absl::StrCat("node ", n["node"].Number(), ": CRIU ",
                                    Duration(r["criu_ms"].Number()), ", threads seized ",
                                    Duration(r["supervise_ms"].Number()), ", memory made coherent ",
                                    Duration(r["memory_ms"].Number())));
  }
  if (!restores.empty()) row("restore, per node", absl::StrJoin(restores, "; "));
  if (s["timeline"].Has("home_ms")) {
    row("went home to node 0", absl::StrCat("at ", Duration(s["timeline"]["home_ms"].Number()),
                                            ": ran there natively to its end"));
  }
  double faults = 0, fetched = 0, held = 0;
  for (const JsonValue& n : nodes.items()) {
    faults += n["read_faults"].Number() + n["write_faults"].Number();
    fetched += n["pages_fetched"].Number();
    held += n["pages_held"].Number();
  }
  row("faults, all nodes", absl::StrCat(Count(faults), " (", Count(fetched), " pages fetched, ",
                                        Count(held), " held from the checkpoint)"));
  row("placement", s["placement"]["policy"].String().empty()
                       ? std::string("(not recorded)")
                       : absl::StrCat(s["placement"]["policy"].String(), ", ",
                                      s["placement"]["decisions"].size(), " decisions"));
  return absl::StrCat("<table class=\"kv\">", rows, "</table>\n");
}

constexpr double kLeft = 70, kPlotWidth = 800, kWidth = 900;

double X(double ms, double end) { return kLeft + (end > 0 ? ms / end : 0) * kPlotWidth; }

void TimeAxis(Svg* svg, double end, double y) {
  svg->Line(kLeft, y, kLeft + kPlotWidth, y, "#666");
  for (const double t : AxisTicks(end / 1000, 8)) {
    if (t * 1000 > end * 1.001) break;
    const double x = X(t * 1000, end);
    svg->Line(x, y, x, y + 4, "#666");
    svg->Text(x, y + 16, absl::StrFormat("%g s", t), "middle");
  }
}

std::string Timeline(const JsonValue& s) {
  const double end = s["timeline"]["end_ms"].Number();
  if (!(end > 0)) return "<p>The stats have no timeline.</p>\n";
  const std::vector<Phase> phases = Phases(s);
  Svg svg(kWidth, 110);
  for (const Phase& p : phases) {
    svg.Rect(
        X(p.start, end), 40, X(p.end, end) - X(p.start, end), 30, p.color,
        absl::StrCat(p.name, ": ", Duration(p.end - p.start), " (from ", Duration(p.start), ")"));
  }
  const double origin = PlacementOrigin(s);
  for (const JsonValue& d : s["placement"]["decisions"].items()) {
    if (!Marked(d)) continue;
    const double x = X(origin + d["t_ms"].Number(), end);
    svg.Line(x, 30, x, 76, "#000", 1.5);
    svg.Text(x, 24, d["action"].String(), "middle", 10);
  }
  TimeAxis(&svg, end, 80);
  std::string legend =
      "<table class=\"phases\"><tr><th></th><th>phase</th><th>from</th>"
      "<th>to</th><th>took</th></tr>\n";
  for (const Phase& p : phases) {
    absl::StrAppend(&legend, "<tr><td><span class=\"swatch\" style=\"background:", p.color,
                    "\"></span></td><td>", HtmlEscape(p.name), "</td><td>", Duration(p.start),
                    "</td><td>", Duration(p.end), "</td><td>", Duration(p.end - p.start),
                    "</td></tr>\n");
  }
  legend += "</table>\n";
  return absl::StrCat(svg.Finish("timeline-picture"), legend);
}

// A line per node over the placement windows: `value` of a node's window, per window.
template <typename Value>
std::string NodeChart(const JsonValue& s, absl::string_view id, absl::string_view unit,
                      const Value& value) {
  const JsonValue& samples = s["placement"]["samples"];
  const double end = s["timeline"]["end_ms"].Number();
  const double origin = PlacementOrigin(s);
  const size_t nodes = s["nodes"].size();
  double max = 0;
  for (const JsonValue& w : samples.items()) {
    for (size_t i = 0; i < nodes; ++i) max = std::max(max, value(w, w["nodes"][i]));
  }
  const std::vector<double> ticks = AxisTicks(max, 4);
  const double top = 14, bottom = 170, y_max = ticks.back();
  auto y = [&](double v) { return bottom - (y_max > 0 ? v / y_max : 0) * (bottom - top); };
  Svg svg(kWidth, 200);
  for (const double t : ticks) {
    svg.Line(kLeft, y(t), kLeft + kPlotWidth, y(t), "#e4e4e4");
    svg.Text(kLeft - 6, y(t) + 4, absl::StrFormat("%g", t), "end");
  }
  svg.Text(12, top - 2, unit, "start", 10, "#555");
  for (const JsonValue& d : s["placement"]["decisions"].items()) {
    if (!Marked(d)) continue;
    const double x = X(origin + d["t_ms"].Number(), end);
    svg.Line(x, top, x, bottom, "#000", 1, /*dashed=*/true);
  }
  for (size_t i = 0; i < nodes; ++i) {
    std::vector<std::pair<double, double>> points;
    for (const JsonValue& w : samples.items()) {
      // A window's value belongs to its whole length, drawn at its end.
      points.emplace_back(X(origin + w["t_ms"].Number(), end), y(value(w, w["nodes"][i])));
    }
    svg.Polyline(points, NodeColor(static_cast<int>(i)));
    svg.Rect(kLeft + 10 + 70 * i, 180, 12, 12, NodeColor(static_cast<int>(i)));
    svg.Text(kLeft + 26 + 70 * i, 190, absl::StrCat("node ", i));
  }
  svg.Line(kLeft, bottom, kLeft + kPlotWidth, bottom, "#666");
  return svg.Finish(id);
}

std::string FaultCharts(const JsonValue& s) {
  const JsonValue& samples = s["placement"]["samples"];
  if (samples.size() == 0 || !samples[0]["nodes"].IsArray()) {
    return "<p>No placement windows were recorded (static placement, a run that was not "
           "distributed, or one that ended within its first window).</p>\n";
  }
  auto per_second = [](const JsonValue& w, const JsonValue& n) {
    const double secs = w["seconds"].Number();
    return secs > 0 ? n["faults"].Number() / secs : 0;
  };
  auto cores = [](const JsonValue& w, const JsonValue& n) {
    const double secs = w["seconds"].Number();
    return secs > 0 ? n["cpu"].Number() / secs : 0;
  };
  const double first = PlacementOrigin(s) + samples[0]["t_ms"].Number();
  const double last = PlacementOrigin(s) + samples[samples.size() - 1]["t_ms"].Number();
  return absl::StrCat("<p>Per placement window (", samples.size(), " windows, ", Duration(first),
                      " to ", Duration(last),
                      " after launch); dashed lines are placement decisions.</p>\n<h3>Faults "
                      "per second</h3>\n",
                      NodeChart(s, "faults-picture", "faults/s", per_second),
                      "<h3>Cores busy</h3>\n", NodeChart(s, "cores-picture", "cores", cores));
}

struct HotRow {
  std::string page;
  double faults = 0;
  std::set<int> nodes;
  std::map<int, std::pair<double, double>> threads;  // tid -> reads, writes
};

// Blends white towards `rgb` by `f` in [0, 1].
std::string Shade(int rgb, double f) {
  auto ch = [&](int shift) {
    const int c = (rgb >> shift) & 0xff;
    return static_cast<int>(std::lround(255 - (255 - c) * std::clamp(f, 0.0, 1.0)));
  };
  return absl::StrFormat("#%02x%02x%02x", ch(16), ch(8), ch(0));
}

std::string HotPages(const JsonValue& s) {
  std::map<std::string, HotRow> by_page;
  for (const JsonValue& n : s["nodes"].items()) {
    for (const JsonValue& p : n["hot_pages"].items()) {
      HotRow& r = by_page[p["page"].String()];
      r.page = p["page"].String();
      r.faults += p["faults"].Number();
      r.nodes.insert(static_cast<int>(n["node"].Number()));
      for (const JsonValue& t : p["threads"].items()) {
        auto& [reads, writes] = r.threads[static_cast<int>(t["tid"].Number())];
        reads += t["reads"].Number();
        writes += t["writes"].Number();
      }
    }
  }
  if (by_page.empty()) {
    return "<p>No page faulted on any node (or the run was not distributed).</p>\n";
  }
  std::vector<HotRow> rows;
  for (auto& [page, r] : by_page) rows.push_back(std::move(r));
  std::stable_sort(rows.begin(), rows.end(),
                   [](const HotRow& a, const HotRow& b) { return a.faults > b.faults; });
  constexpr size_t kRows = 24;
  if (rows.size() > kRows) rows.resize(kRows);
  std::set<int> tids;
  double max = 0;
  for (const HotRow& r : rows) {
    for (const auto& [tid, rw] : r.threads) {
      tids.insert(tid);
      max = std::max(max, rw.first + rw.second);
    }
  }
  const double label = 190, cell_w = 34, cell_h = 18, top = 34;
  const double width = label + cell_w * tids.size() + 170;
  Svg svg(std::max(width, 420.0), top + cell_h * rows.size() + 10);
  svg.Text(label - 8, top - 8, "page (nodes)", "end", 10, "#555");
  int column = 0;
  for (const int tid : tids) {
    svg.Text(label + cell_w * column++ + cell_w / 2, top - 8,
             tid > 0 ? absl::StrCat("t", tid) : "t?", "middle", 10);
  }
  svg.Text(label + cell_w * tids.size() + 8, top - 8, "faults, threads", "start", 10, "#555");
  for (size_t k = 0; k < rows.size(); ++k) {
    const HotRow& r = rows[k];
    const double y = top + cell_h * k;
    std::vector<std::string> nodes;
    for (const int n : r.nodes) nodes.push_back(absl::StrCat(n));
    svg.Text(label - 8, y + 13, absl::StrCat(r.page, " (", absl::StrJoin(nodes, ","), ")"), "end",
             10);
    column = 0;
    for (const int tid : tids) {
      const double x = label + cell_w * column++;
      auto it = r.threads.find(tid);
      if (it == r.threads.end()) {
        svg.Rect(x + 1, y + 1, cell_w - 2, cell_h - 2, "#f6f6f6");
        continue;
      }
      const auto [reads, writes] = it->second;
      const double f = max > 0 ? std::log1p(reads + writes) / std::log1p(max) : 0;
      // Red where the thread wrote (a writer moves the page between nodes), blue where it
      // only read.
      svg.Rect(x + 1, y + 1, cell_w - 2, cell_h - 2,
               Shade(writes > 0 ? 0xb2182b : 0x2166ac, 0.15 + 0.85 * f),
               absl::StrFormat("page %s, thread %d: %s reads, %s writes", r.page, tid, Count(reads),
                               Count(writes)));
    }
    svg.Text(label + cell_w * tids.size() + 8, y + 13,
             absl::StrCat(Count(r.faults), ", ", r.threads.size(),
                          r.threads.size() > 1 ? " threads (shared)" : " thread"),
             "start", 10, r.threads.size() > 1 ? "#b2182b" : "#222");
  }
  return absl::StrCat(
      "<p>The ", rows.size(),
      " pages that faulted most over the run, all nodes together, and each thread's faults on "
      "them: red cells are threads that wrote the page, blue ones only read it, darker is more "
      "(hover a cell for its counts). A page two threads fault on is shared; when they run on "
      "different nodes and one writes, each write takes the page from the other node.</p>\n",
      svg.Finish("hot-pages-picture"));
}

std::string Futex(const JsonValue& s) {
  const JsonValue& nodes = s["nodes"];
  if (nodes.size() == 0) return "<p>The run was not distributed: its futexes were native.</p>\n";
  double max = std::max(s["server"]["futex_waits"].Number(), s["server"]["futex_wakes"].Number());
  for (const JsonValue& n : nodes.items()) {
    max = std::max({max, n["futex"]["waits"].Number(), n["futex"]["wakes"].Number()});
  }
  const double label = 120, bar_w = 560, bar_h = 12;
  const size_t rows = nodes.size() + 1;
  Svg svg(kWidth, 14 + rows * 34);
  auto bars = [&](size_t k, const std::string& name, double waits, double wakes,
                  const std::string& color) {
    const double y = 10 + 34 * k;
    svg.Text(label - 8, y + 16, name, "end");
    svg.Rect(label, y, max > 0 ? bar_w * waits / max : 0, bar_h, color,
             absl::StrCat(name, ": ", Count(waits), " futex waits"));
    svg.Text(label + (max > 0 ? bar_w * waits / max : 0) + 6, y + 10,
             absl::StrCat(Count(waits), " waits"), "start", 10);
    svg.Rect(label, y + bar_h + 2, max > 0 ? bar_w * wakes / max : 0, bar_h, Shade(0x222222, 0.4),
             absl::StrCat(name, ": ", Count(wakes), " futex wakes"));
    svg.Text(label + (max > 0 ? bar_w * wakes / max : 0) + 6, y + bar_h + 12,
             absl::StrCat(Count(wakes), " wakes"), "start", 10);
  };
  std::string table =
      "<table><tr><th>where</th><th>waits</th><th>wakes</th><th>served by node 0 itself</th>"
      "</tr>\n";
  for (size_t i = 0; i < nodes.size(); ++i) {
    const JsonValue& f = nodes[i]["futex"];
    bars(i, absl::StrCat("node ", i), f["waits"].Number(), f["wakes"].Number(),
         NodeColor(static_cast<int>(i)));
    absl::StrAppend(&table, "<tr><td>node ", i, "</td><td>", Count(f["waits"].Number()),
                    "</td><td>", Count(f["wakes"].Number()), "</td><td>",
                    f.Has("exclusive") ? Count(f["exclusive"].Number()) : "", "</td></tr>\n");
  }
  const JsonValue& server = s["server"];
  bars(nodes.size(), "server", server["futex_waits"].Number(), server["futex_wakes"].Number(),
       "#555555");
  absl::StrAppend(&table, "<tr><td>server</td><td>", Count(server["futex_waits"].Number()),
                  "</td><td>", Count(server["futex_wakes"].Number()), "</td><td></td></tr>\n",
                  "</table>\n");
  return absl::StrCat(
      "<p>The program's futex calls (the waits and wakes under its mutexes, condition variables "
      "and joins) as each node's agent served them; the server's table serves those shared "
      "between nodes, node 0 its own once every thread runs there.</p>\n",
      svg.Finish("futex-picture"), table);
}

std::string Traffic(const JsonValue& s) {
  const JsonValue& nodes = s["nodes"];
  if (nodes.size() == 0) return "<p>The run was not distributed.</p>\n";
  const std::pair<const char*, const char*> columns[] = {
      {"threads_run", "threads run"},         {"read_faults", "read faults"},
      {"write_faults", "write faults"},       {"upgrades", "upgrades"},
      {"pages_fetched", "pages fetched"},     {"pages_read_ahead", "read ahead"},
      {"pages_held", "held from checkpoint"}, {"invalidations_received", "invalidations received"},
      {"messages_sent", "messages sent"},
  };
  std::string html = "<table><tr><th>node</th>";
  for (const auto& [key, name] : columns) absl::StrAppend(&html, "<th>", name, "</th>");
  html += "<th>bytes sent</th><th>fault latency p50 / p99</th></tr>\n";
  for (const JsonValue& n : nodes.items()) {
    absl::StrAppend(&html, "<tr><td>", n["node"].Number(), "</td>");
    for (const auto& [key, name] : columns) {
      absl::StrAppend(&html, "<td>", Count(n[key].Number()), "</td>");
    }
    const JsonValue& lat = n["fault_latency"];
    absl::StrAppend(&html, "<td>", Bytes(n["bytes_sent"].Number()), "</td><td>",
                    lat["count"].Number() > 0
                        ? absl::StrFormat("%.0f / %.0f us", lat["p50_ns"].Number() / 1000,
                                          lat["p99_ns"].Number() / 1000)
                        : std::string("-"),
                    "</td></tr>\n");
  }
  return html + "</table>\n";
}

std::string Decisions(const JsonValue& s) {
  const JsonValue& p = s["placement"];
  std::string html;
  if (p.Has("history")) {
    absl::StrAppend(&html, "<p>Before the run, from ", p["history"]["earlier_runs"].Number(),
                    " earlier runs in ", HtmlEscape(p["history"]["file"].String()), ": ",
                    HtmlEscape(p["history"]["choice"].String()), ", because ",
                    HtmlEscape(p["history"]["reason"].String()), ".</p>\n");
  }
  if (p["decisions"].size() == 0) {
    return html + "<p>No placement decision was taken during the run.</p>\n";
  }
  absl::StrAppend(&html,
                  "<table class=\"decisions\"><tr><th>at</th><th>action</th><th>cores busy</th>"
                  "<th>predicted</th><th>threads moved</th><th>reason</th></tr>\n");
  const double origin = PlacementOrigin(s);
  for (const JsonValue& d : p["decisions"].items()) {
    std::string reason = d["reason"].String();
    if (reason.empty() && d.Has("assignment")) {
      reason = absl::StrCat("node ", d["node"].Number(), "'s ", d["node_cores"].Number(),
                            " cores by thread (thread:cores) ", d["assignment"].String());
    }
    absl::StrAppend(
        &html, "<tr class=\"", HtmlEscape(d["action"].String()), "\"><td>",
        Duration(origin + d["t_ms"].Number()), "</td><td>", HtmlEscape(d["action"].String()),
        "</td><td>", d.Has("cores") ? absl::StrFormat("%.2f", d["cores"].Number()) : "",
        "</td><td>",
        d.Has("predicted_cores") ? absl::StrFormat("%.2f", d["predicted_cores"].Number()) : "",
        "</td><td>",
        d.Has("threads_moved")
            ? absl::StrCat(d["threads_moved"].Number(),
                           d["threads_not_moved"].Number() > 0
                               ? absl::StrCat(" (", d["threads_not_moved"].Number(), " not)")
                               : "")
            : "",
        "</td><td>", HtmlEscape(reason), "</td></tr>\n");
  }
  return html + "</table>\n";
}

constexpr char kStyle[] = R"(
body { font-family: sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1em; margin-bottom: 0.2em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
table.kv th { background: #f4f4f4; width: 14em; }
td:not(:last-child) { white-space: nowrap; }
.swatch { display: inline-block; width: 1em; height: 1em; }
tr.consolidate, tr.consolidate_rest { background: #eef6ee; } tr.probe { background: #fdf3e7; }
)";

}  // namespace

absl::StatusOr<std::string> RenderRunReport(absl::string_view stats) {
  absl::StatusOr<JsonValue> parsed = JsonValue::Parse(stats);
  if (!parsed.ok()) return parsed.status();
  const JsonValue& s = *parsed;
  if (!s.IsObject() || !s.Has("migrated")) {
    return absl::InvalidArgumentError(
        "not the stats of a stretchd run (no \"migrated\" member): write them with "
        "`stretchd run --stats_json=FILE`");
  }
  std::string title = "Stretch run";
  if (s["command"].size() > 0) {
    std::string program = s["command"][0].String();
    program = program.substr(program.rfind('/') + 1);
    absl::StrAppend(&title, ": ", program);
  }
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>", HtmlEscape(title),
      "</title><style>", kStyle, "</style></head><body>\n<h1>", HtmlEscape(title), "</h1>\n",
      Section("summary", "Summary", Summary(s)),
      Section("timeline", "Migration timeline", Timeline(s)),
      Section("faults", "Faults per node over time", FaultCharts(s)),
      Section("hot-pages", "Pages that faulted most, and which threads shared them", HotPages(s)),
      Section("futex", "Futex traffic", Futex(s)),
      Section("traffic", "Protocol traffic per node", Traffic(s)),
      Section("decisions", "Placement decisions", Decisions(s)), "</body></html>\n");
}

absl::Status WriteRunReport(absl::string_view stats, const std::string& path) {
  absl::StatusOr<std::string> html = RenderRunReport(stats);
  if (!html.ok()) return html.status();
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::InternalError(ErrnoStatus(errno, absl::StrCat("write ", path)).ToString());
  }
  const bool written = std::fwrite(html->data(), 1, html->size(), f) == html->size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    return absl::InternalError(ErrnoStatus(errno, absl::StrCat("write ", path)).ToString());
  }
  return absl::OkStatus();
}

}  // namespace stretch::report
