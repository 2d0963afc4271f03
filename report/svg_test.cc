#include "report/svg.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stretch::report {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(HtmlEscapeTest, EscapesMarkupAndQuotes) {
  EXPECT_EQ(HtmlEscape(R"(<a href="x">Tom & 'Jerry'</a>)"),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;");
  EXPECT_EQ(HtmlEscape("plain"), "plain");
}

TEST(SvgTest, EscapesTextAndTooltipsAndScalesToItsViewBox) {
  Svg svg(300, 100);
  svg.Rect(1, 2, 3, 4, "#123456", "a <b> & c");
  svg.Rect(0, 0, -5, 1, "red");  // a negative width is drawn as nothing, not refused
  svg.Text(5, 6, "x < y");
  const std::string out = svg.Finish("pic");
  EXPECT_THAT(
      out, HasSubstr(R"(<svg id="pic" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 300 100")"));
  EXPECT_THAT(out, HasSubstr("<title>a &lt;b&gt; &amp; c</title>"));
  EXPECT_THAT(out, HasSubstr(R"(width="0.0")"));
  EXPECT_THAT(out, HasSubstr(">x &lt; y</text>"));
}

TEST(AxisTicksTest, RoundStepsCoveringTheMaximum) {
  EXPECT_THAT(AxisTicks(9.3, 4), ElementsAre(0, 5, 10));
  EXPECT_THAT(AxisTicks(1000, 4), ElementsAre(0, 500, 1000));
  EXPECT_THAT(AxisTicks(0.07, 4), ElementsAre(0, 0.02, 0.04, 0.06, 0.08));
  EXPECT_THAT(AxisTicks(0, 4), ElementsAre(0, 1));
}

}  // namespace
}  // namespace stretch::report
