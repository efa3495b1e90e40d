#include <gtest/gtest.h>

#include "batchtune/common/error.h"
#include "batchtune/common/size.h"

using batchtune::format_bytes;
using batchtune::parse_size;

TEST(Size, ParsesPlainCounts) {
  EXPECT_EQ(parse_size("1048576"), 1048576);
  EXPECT_EQ(parse_size("1"), 1);
}

TEST(Size, ParsesBinaryAndDecimalUnits) {
  EXPECT_EQ(parse_size("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_size("1.5GB"), 1500000000);
  EXPECT_EQ(parse_size("64kib"), 65536);
  EXPECT_EQ(parse_size("3 KB"), 3000);
  EXPECT_EQ(parse_size("1G"), int64_t{1} << 30);
  EXPECT_EQ(parse_size("100B"), 100);
  EXPECT_EQ(parse_size("0.5MiB"), 524288);
}

TEST(Size, RejectsMalformedSizesNamingTheFlag) {
  for (const char* bad : {"", "MiB", "-5", "0", "0MiB", "1.2.3GB", "12 parsecs", "5 MiB extra",
                          "1e3", ".", "99999999999999999999TiB", "0.0000001B"}) {
    try {
      parse_size(bad, "--memory-limit");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const batchtune::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--memory-limit"), std::string::npos) << e.what();
    }
  }
}

TEST(Size, FormatsForPeople) {
  EXPECT_EQ(format_bytes(812), "812 B");
  EXPECT_EQ(format_bytes(int64_t{512} << 20), "512.0 MiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 29), "1.50 GiB");
}
