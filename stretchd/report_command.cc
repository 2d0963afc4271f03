// `stretchd report` (commands.h): the picture of a run from its stats.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "report/run_report.h"
#include "stretchd/commands.h"
#include "stretchd/flags.h"

namespace stretch {

int RunReport(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr,
                 "stretchd report: give one STATS_JSON file or run WORK_DIR (see `stretchd "
                 "report --help`)\n");
    return 2;
  }
  // A run's work directory (--work_dir) keeps its stats as stats.json.
  std::string stats_path = args[0];
  struct stat st;
  const bool is_dir = stat(stats_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (is_dir) stats_path = absl::StrCat(stats_path, "/stats.json");
  std::ifstream in(stats_path);
  if (!in) {
    std::fprintf(stderr, "stretchd report: cannot read %s%s\n", stats_path.c_str(),
                 is_dir ? " (a directory without a run's stats.json)" : "");
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  std::string out = FLAGS_out;
  if (out.empty()) {
    out = is_dir ? absl::StrCat(args[0], "/report.html")
                 : absl::StrCat(absl::EndsWith(stats_path, ".json")
                                    ? stats_path.substr(0, stats_path.size() - 5)
                                    : stats_path,
                                ".html");
  }
  if (absl::Status s = report::WriteRunReport(text.str(), out); !s.ok()) {
    std::fprintf(stderr, "stretchd report: %s: %s\n", stats_path.c_str(),
                 std::string(s.message()).c_str());
    return 1;
  }
  std::printf("stretchd report: wrote %s\n", out.c_str());
  return 0;
}

}  // namespace stretch
