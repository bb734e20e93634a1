// StopMatcher: stop strings are never emitted, also when they arrive split over several pushes;
// text that only looks like the start of a stop string is released once it cannot match.
#include <gtest/gtest.h>

#include "kiln/server/stop_matcher.h"

using kiln::server::StopMatcher;

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.push(""), "");
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, StopInsideOnePush) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("hello END world"), "hello ");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "END");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, StopSplitAcrossPushesIsHeldBack) {
  StopMatcher m({"named Lily"});
  std::string out;
  for (const char* piece : {"a girl ", "na", "med", " Li", "ly. She"}) out += m.push(piece);
  EXPECT_EQ(out, "a girl ");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.push("xab"), "x");    // "ab" could start "abc"
  EXPECT_EQ(m.push("d"), "abd");    // it did not
  EXPECT_EQ(m.push("a"), "");
  EXPECT_EQ(m.flush(), "a");        // the end releases what was held
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.push("hello world"), "hel");
  EXPECT_EQ(m.matched(), "lo w");
}

TEST(StopMatcher, ConcatenationEqualsTextBeforeTheStop) {
  // Every way of cutting the text into two pieces gives the same result.
  const std::string text = "One day, she saw a big, red ball. She wanted";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    StopMatcher m({"red ball", "zzz"});
    std::string out = m.push(text.substr(0, cut));
    out += m.push(text.substr(cut));
    out += m.flush();
    EXPECT_EQ(out, "One day, she saw a big, ") << cut;
    EXPECT_TRUE(m.stopped());
  }
}
