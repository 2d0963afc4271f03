#include "report/run_report.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch::report {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A K-means run on two emulated nodes (stretchd run --migrate_after=0 --stats_json): migrated,
// consolidated on node 0 at its third window, then taken home.
std::string KmeansStats() {
  return ReadFile(std::string(std::getenv("TEST_SRCDIR")) +
                  "/stretch/report/testdata/kmeans_stats.json");
}

size_t Position(const std::string& html, const std::string& text) {
  const size_t at = html.find(text);
  EXPECT_NE(at, std::string::npos) << "missing: " << text;
  return at;
}

TEST(RunReportTest, DrawsEveryPartOfADistributedRun) {
  auto html = RenderRunReport(KmeansStats());
  ASSERT_TRUE(html.ok()) << html.status();
  for (const char* id : {"summary", "timeline", "faults", "hot-pages", "futex", "traffic",
                         "decisions", "timeline-picture", "faults-picture", "cores-picture",
                         "hot-pages-picture", "futex-picture"}) {
    EXPECT_THAT(*html, HasSubstr(std::string("id=\"") + id + "\"")) << id;
  }
  EXPECT_THAT(*html, HasSubstr("<title>Stretch run: kmeans</title>"));
  EXPECT_THAT(*html, HasSubstr("/usr/local/bin/kmeans --size=400000 --threads=4"));
  // Nothing is fetched: the page stands alone.
  EXPECT_THAT(*html, Not(HasSubstr("src=")));
  EXPECT_THAT(*html, Not(HasSubstr("href=")));
}

TEST(RunReportTest, TheTimelineHasTheMigrationsPhasesInOrder) {
  auto html = RenderRunReport(KmeansStats());
  ASSERT_TRUE(html.ok());
  const std::string& h = *html;
  const size_t legend = Position(h, "<table class=\"phases\">");
  size_t at = legend;
  for (const char* phase :
       {">native<", ">stop<", ">checkpoint (criu dump)<", ">restore (criu restore, every node)<",
        ">distributed<", ">going home (gather, dump, restore on node 0)<",
        ">on node 0, natively<"}) {
    const size_t next = h.find(phase, legend);
    ASSERT_NE(next, std::string::npos) << phase;
    EXPECT_GT(next, at) << phase << " out of order";
    at = next;
  }
  // The consolidation is marked on the timeline.
  const size_t picture = Position(h, "id=\"timeline-picture\"");
  EXPECT_LT(h.find(">consolidate</text>", picture), h.find("</svg>", picture));
}

TEST(RunReportTest, ShowsTheConsolidationWithItsReasonAndTheMostSharedPage) {
  auto html = RenderRunReport(KmeansStats());
  ASSERT_TRUE(html.ok());
  const std::string& h = *html;
  const size_t decisions = Position(h, "id=\"decisions\"");
  const size_t row = h.find("<tr class=\"consolidate\">", decisions);
  ASSERT_NE(row, std::string::npos);
  EXPECT_LT(h.find("predicts 0.26 cores busy all on node 0", row), h.find("</tr>", row));
  // The page both nodes faulted on most: 69 faults on node 0 alone, threads 3 and 5 writing.
  const size_t pages = Position(h, "id=\"hot-pages-picture\"");
  const size_t first_row = h.find("0x558cfe70e000 (0,1)", pages);
  ASSERT_NE(first_row, std::string::npos);
  EXPECT_LT(first_row, h.find("</svg>", pages));
  EXPECT_THAT(h.substr(first_row, 4000), HasSubstr("threads (shared)"));
  EXPECT_THAT(h, HasSubstr("page 0x558cfe70e000, thread 5: "));
}

TEST(RunReportTest, SaysWhatEachNodesRestoreTook) {
  std::string stats = KmeansStats();
  stats = absl::StrReplaceAll(
      stats, {{R"("node":1,)",
               R"("node":1,"restore":{"criu_ms":210.5,"supervise_ms":12,"memory_ms":95},)"}});
  auto html = RenderRunReport(stats);
  ASSERT_TRUE(html.ok()) << html.status();
  EXPECT_THAT(*html, HasSubstr("node 1: CRIU 210 ms, threads seized 12 ms, memory made coherent "
                               "95 ms"));
}

TEST(RunReportTest, EscapesTextTakenFromTheStats) {
  std::string stats = KmeansStats();
  stats = absl::StrReplaceAll(stats, {{"over the last 100 ms", "<script>alert(1)</script>"}});
  auto html = RenderRunReport(stats);
  ASSERT_TRUE(html.ok());
  EXPECT_THAT(*html, Not(HasSubstr("<script>")));
  EXPECT_THAT(*html, HasSubstr("&lt;script&gt;alert(1)&lt;/script&gt;"));
}

TEST(RunReportTest, ARunThatWasNotMigratedSaysWhy) {
  auto html = RenderRunReport(
      R"({"command":["/bin/prog"],"timeline":{"end_ms":1716.4},"nodes":[],"migrated":false,)"
      R"("native_parallel_ms":319,"migrate_after_ms":411})");
  ASSERT_TRUE(html.ok()) << html.status();
  EXPECT_THAT(*html, HasSubstr("its parallel work ended after 319 ms, sooner than migrating it "
                               "would have paid off (411 ms)"));
  EXPECT_THAT(*html, HasSubstr(">native, on one node<"));
  EXPECT_THAT(*html, HasSubstr("No placement windows were recorded"));
  EXPECT_THAT(*html, HasSubstr("its futexes were native"));
}

TEST(RunReportTest, RefusesWhatIsNotARunsStats) {
  auto bad = RenderRunReport("{\"nodes\":[1,2");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("at byte 13"));
  auto other = RenderRunReport(R"({"read_faults":3})");
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("not the stats of a stretchd run"));
}

TEST(RunReportTest, WritesThePageOrSaysWhyNot) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  ASSERT_TRUE(WriteRunReport(KmeansStats(), dir + "/run.html").ok());
  EXPECT_THAT(ReadFile(dir + "/run.html"), HasSubstr("</html>"));
  absl::Status s = WriteRunReport(KmeansStats(), dir + "/no/such/dir/run.html");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no/such/dir/run.html"));
}

}  // namespace
}  // namespace stretch::report
